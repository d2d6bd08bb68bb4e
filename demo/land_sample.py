"""Demo: land a Singer message file in a local lake through the core, then read it back with Spark.

Usage: python demo/land_sample.py [INPUT] [LAKE_ROOT]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from singerlake import Lake, SchemaWriter
from singerlake.cli import describe_lake
from singerlake.paths import now_ms
from singerlake.singer_file import record_time_ms
from singerlake.spark import spark_session

HERE = Path(__file__).parent


def land(input_path: Path, lake: Lake, tap_id: str) -> dict[str, int]:
    writers: dict[str, SchemaWriter] = {}
    batches: dict[str, tuple[list[bytes], list[int]]] = {}
    sent: dict[str, int] = {}

    def flush(stream: str) -> None:
        lines, times = batches.pop(stream, ([], []))
        if lines:
            writer = writers[stream]
            writer.commit([writer.write_file(lines, times)])

    with open(input_path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            message = json.loads(raw)
            stream = message.get("stream")
            if message["type"] == "SCHEMA":
                new = SchemaWriter(lake, tap_id, message, schema_line=raw.rstrip(b"\n"))
                old = writers.get(stream)
                if old is None or old.schema_hash != new.schema_hash:
                    flush(stream)
                    if old:
                        old.close()
                    writers[stream] = new.open()
            elif message["type"] == "RECORD":
                if stream not in writers:
                    raise SystemExit(f"{input_path}:{number}: RECORD for {stream!r} before its SCHEMA")
                lines, times = batches.setdefault(stream, ([], []))
                lines.append(raw.rstrip(b"\n"))
                times.append(record_time_ms(message, now_ms()))
                sent[stream] = sent.get(stream, 0) + 1
    for stream, writer in writers.items():
        flush(stream)
        writer.close()
    return sent


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
    lake = Lake.open(str(root))
    sent = land(input_path, lake, "tap-demo")
    print(f"landed {sum(sent.values())} records from {input_path} into {root}")
    print(json.dumps(describe_lake(lake), indent=1, ensure_ascii=False))
    counted = count_with_spark(root)
    print(f"Spark local[*] reads back {counted} RECORD messages from the lake's .singer.gz files")


if __name__ == "__main__":
    main()
