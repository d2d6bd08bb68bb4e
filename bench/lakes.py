"""Landed lakes for the benchmarks: a Singer file landed by the real target-singerlake, and the
messages that update some of its keys."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

BIN = Path(sys.executable).parent
TAP_ID = "tap-bench"


def land(lake: Path, source: Path, work: Path) -> None:
    """Land ``source`` (Singer messages) into ``lake`` (new or existing) with target-singerlake; its config goes in ``work``."""
    config = work / "target.json"
    config.write_text(json.dumps({"lake_root": str(lake), "tap_id": TAP_ID}))
    with open(source, "rb") as stdin:
        subprocess.run([str(BIN / "target-singerlake"), "--config", str(config)], stdin=stdin, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=True)  # fmt: skip


def updates(source: Path, count: int, out: Path, moved: int = 0) -> Path:
    """The stream's SCHEMA and its first ``count`` records again, changed: ``count`` updated keys, written to ``out``;
    the first ``moved`` of them also a day later in ``created_at``. Reads only as far as it needs (a 10M-record source is 3 GB)."""
    schema, changed = None, []
    with open(source, encoding="utf-8") as lines:
        for line in lines:
            message = json.loads(line)
            if message["type"] == "SCHEMA" and schema is None:
                schema = line.rstrip("\n")
            elif message["type"] == "RECORD":
                message["record"]["name"] = f"updated {len(changed)}"
                if len(changed) < moved:  # its day changes: the key moves to another partition
                    created = datetime.fromisoformat(message["record"]["created_at"].replace("Z", "+00:00")) + timedelta(days=1)
                    message["record"]["created_at"] = created.strftime("%Y-%m-%dT%H:%M:%SZ")
                changed.append(json.dumps(message))
                if len(changed) == count:
                    break
    if schema is None:
        raise ValueError(f"{source}: no SCHEMA before its first {count} records")
    out.write_text("\n".join([schema, *changed]) + "\n")
    return out
