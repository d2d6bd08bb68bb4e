"""The README is for users: short, its first screen says what it is, how to install it and what to type first,
no development history, and every example of it runs as written (in a scratch directory with the repository's
sample input, the commands from .venv/bin)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
RUNNABLE = ["## Land and replay without Meltano", "## Tables and SQL", "## Any file", "## Keeping the lake sound"]


def sh_blocks(heading: str) -> list[str]:
    section = README.split(heading + "\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def test_readme_is_short_and_its_first_screen_answers_what_how_and_first():
    lines = README.splitlines()
    assert len(lines) <= 250, len(lines)
    first_screen = "\n".join(lines[:50])
    assert "lake on object storage" in first_screen  # what it is
    assert "meltano add loader target-singerlake" in first_screen and "pip install" in first_screen  # install
    assert "meltano run tap-postgres target-singerlake singerlake:project" in first_screen  # what to type first


def test_nothing_a_user_reads_carries_development_history():
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    for page in pages:
        text = page.read_text()
        assert not re.search(r"(?<![\w&])#\d{1,3}\b", text), (page, re.search(r"(?<![\w&])#\d{1,3}\b", text))
        assert not re.search(r"\b(?:at|commit) [0-9a-f]{7,40}\b", text), page


@pytest.mark.heavy
def test_every_readme_example_runs_as_written(tmp_path):
    (tmp_path / "demo").mkdir()
    shutil.copy(REPO / "demo" / "sample.singer.jsonl", tmp_path / "demo")
    script = "\n".join(block for heading in RUNNABLE for block in sh_blocks(heading))
    assert script.count("singerlake") >= 10, script  # the sections hold the examples
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("SINGERLAKE_LAKE_ROOT", None)
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    replayed = (tmp_path / "replayed.singer.jsonl").read_text().splitlines()
    landed = [line for line in (REPO / "demo" / "sample.singer.jsonl").read_text().splitlines() if '"RECORD"' in line]
    assert sum('"RECORD"' in line for line in replayed) == len(landed)
    assert (tmp_path / "lake" / "published").is_dir() and (tmp_path / "site" / "index.html").is_file()
    assert [path.read_text() for path in (tmp_path / "fetched").rglob("*") if path.is_file()] == ["GET / 200\n"]
