"""Without Meltano: land a Singer message file with target-singerlake, read it back with Spark, and replay it
with tap-singerlake. (The README's main job, `./dev demo`, is meltano_demo.py.)

Usage: python demo/land_sample.py [INPUT] [LAKE_ROOT]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from singerlake import Lake
from singerlake.jobs.describe import describe_lake
from singerlake.spark.session import spark_session

HERE = Path(__file__).parent


def land(input_path: Path, root: Path, tap_id: str) -> list[str]:
    """Pipe the input through the target (Spark local[*]); returns the STATE lines it printed."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as config:
        json.dump({"lake_root": str(root), "tap_id": tap_id}, config)
        config.flush()
        with open(input_path, "rb") as source:
            run = subprocess.run(
                [str(Path(sys.executable).parent / "target-singerlake"), "--config", config.name],
                stdin=source,
                capture_output=True,
                text=True,
            )
    if run.returncode != 0:
        raise SystemExit(f"target-singerlake failed:\n{run.stderr[-3000:]}")
    return run.stdout.splitlines()


def replay(root: Path, tap_id: str) -> list[bytes]:
    """Run tap-singerlake over the lake; returns its stdout lines."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as config:
        json.dump({"lake_root": str(root), "tap_id": tap_id}, config)
        config.flush()
        run = subprocess.run([str(Path(sys.executable).parent / "tap-singerlake"), "--config", config.name], capture_output=True)
    if run.returncode != 0:
        raise SystemExit(f"tap-singerlake failed:\n{run.stderr.decode()[-3000:]}")
    return run.stdout.splitlines()


def records_by_stream(lines: list[bytes]) -> dict[str, list[bytes]]:
    streams: dict[str, list[bytes]] = {}
    for line in lines:
        message = json.loads(line)
        if message["type"] == "RECORD":
            streams.setdefault(message["stream"], []).append(line)
    return streams


def count_with_spark(root: Path) -> int:
    spark = spark_session("local[*]", "singerlake-demo")
    try:
        lines = spark.read.text(str(root / "raw" / "*" / "*" / "*" / "*.singer.gz"))
        return lines.filter(lines.value.contains('"type": "RECORD"')).count()
    finally:
        spark.stop()


def main() -> None:
    input_path = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "sample.singer.jsonl"
    root = Path(sys.argv[2] if len(sys.argv) > 2 else "singerlake").absolute()
    sent = sum(1 for line in open(input_path, "rb") if json.loads(line)["type"] == "RECORD")
    states = land(input_path, root, "tap-demo")
    lake = Lake.open(str(root))
    print(f"landed {sent} records from {input_path} into {root}; last STATE: {states[-1] if states else None}")
    print(json.dumps(describe_lake(lake), indent=1, ensure_ascii=False))
    counted = count_with_spark(root)
    print(f"Spark local[*] reads back {counted} RECORD messages from the lake's .singer.gz files")
    replayed = records_by_stream(replay(root, "tap-demo"))
    same = replayed == records_by_stream(input_path.read_bytes().splitlines())
    total = sum(len(lines) for lines in replayed.values())
    print(f"tap-singerlake replays {total} records; byte-identical to the input, per stream and in order: {same}")
    if not same:
        raise SystemExit("the replay differs from the input")


if __name__ == "__main__":
    main()
