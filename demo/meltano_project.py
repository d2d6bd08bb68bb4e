"""A runnable copy of this repo's Meltano project that needs neither `meltano install` nor the network.

Meltano installs a plugin that has a `pip_url` into .meltano/<type>/<name>/venv, but runs one without
a `pip_url` as its `executable` from the PATH. `./dev` installs all four plugins and meltano itself into
.venv (the PyPI tools into venvs of their own, linked into .venv/bin), so the copy differs from
./meltano.yml only by having no `pip_url`. Used by demo/meltano_demo.py and tests/test_meltano.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # .venv/bin: our plugins, and the links ./dev makes to meltano, tap-jsonl, target-jsonl
SAMPLE = REPO / "demo" / "jsonl"  # tap-jsonl's input: one stream, `users`
MORE = REPO / "demo" / "more"  # a later file of the same stream, with one more field
SDC_COLUMNS = {"_sdc_last_modified", "_sdc_filename", "_sdc_stream"}  # what tap-jsonl adds to each record


def create(project: Path) -> Path:
    """A copy of meltano.yml without pip_url, and the sample input, in `project` (which must not exist)."""
    spec = yaml.safe_load((REPO / "meltano.yml").read_text())
    for plugins in spec["plugins"].values():
        for plugin in plugins:
            plugin.pop("pip_url", None)
    shutil.copytree(SAMPLE, project / "demo" / "jsonl")
    (project / "meltano.yml").write_text(yaml.safe_dump(spec, sort_keys=False, allow_unicode=True))
    return project


def env() -> dict[str, str]:
    dead = "http://127.0.0.1:9"  # a client that still tried the network would fail at once rather than leave the machine
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "MELTANO_SEND_ANONYMOUS_USAGE_STATS": "false",
        "MELTANO_CLI_DISABLE_VERSION_CHECK": "true",  # else it asks PyPI for a newer meltano
        "NO_COLOR": "1",
        **{name: dead for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")},
        "NO_PROXY": "127.0.0.1,localhost",
    }


def meltano(project: Path, *args: str) -> subprocess.CompletedProcess:
    """Run the meltano CLI in `project`; raises with its stderr when it fails."""
    exe = BIN / "meltano"
    if not exe.exists():
        raise SystemExit(f"{exe} is missing: run ./dev tools (installs meltano, tap-jsonl and target-jsonl)")
    run = subprocess.run([str(exe), *args], cwd=project, env=env(), capture_output=True, text=True, timeout=900)
    if run.returncode != 0:
        raise RuntimeError(f"meltano {' '.join(args)} failed with exit code {run.returncode}:\n{run.stderr[-5000:]}")
    return run


def read_jsonl(*paths: Path) -> list[dict]:
    return [json.loads(line) for path in paths for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def without_sdc(records: list[dict]) -> list[dict]:
    """Records as they were in the input files: without the columns tap-jsonl adds."""
    return [{key: value for key, value in record.items() if key not in SDC_COLUMNS} for record in records]
