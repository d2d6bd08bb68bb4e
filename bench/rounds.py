"""The long run on a local lake: a stream landed then projected, round after round; does the 1,000th
incremental `project` cost what the 10th does?

    python bench/rounds.py [--rounds 1000] [--records 10]

Each round lands --records new records with the core's SchemaWriter (no Spark) and projects the stream
in this process (a one-task run of a local master starts no Spark), as a scheduled pipeline projecting
after every landing would. Printed for rounds 1, 10, 100 and --rounds: the project's wall time (the
median of that round and the 4 after it, and their spread: the machine is shared) and the storage
calls it made (GET, HEAD, PUT, LIST; a Delta checkpoint round, every 6th, says so), then the
difference between the last mark and round 10 against the goal (within 0.5 s).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from singerlake.lake import Lake  # noqa: E402
from singerlake.landing.writer import SchemaWriter  # noqa: E402
from singerlake.spark.session import OnDemand  # noqa: E402
from singerlake.storage import LocalStorage  # noqa: E402
from singerlake.tables.delta_log import checkpoint_due  # noqa: E402
from singerlake.tables.project import project  # noqa: E402
from support.lakes import TAP, record_msg  # noqa: E402
from support.storage import KINDS, Counting  # noqa: E402

STREAM = "orders"
SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "note": {"type": "string"}, "total": {"type": "number"}}}
T0 = 1_795_000_000_000
WINDOW = 5  # rounds per mark: the median of their walls


def land(lake: Lake, first: int, count: int) -> None:
    message = {"type": "SCHEMA", "stream": STREAM, "schema": SCHEMA, "key_properties": ["id"]}
    ids = range(first, first + count)
    with SchemaWriter(lake, TAP, message) as writer:
        lines = [record_msg(STREAM, {"id": i, "note": f"order {i}", "total": i / 4}) for i in ids]
        writer.commit([writer.write_file(lines, [T0 + i for i in ids])])


def no_spark():
    raise SystemExit("a one-task project of a local master should start no Spark")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--records", type=int, default=10, help="new records landed per round")
    args = parser.parse_args()
    marks = sorted({1, 10, 100, args.rounds} & set(range(1, args.rounds + 1)))
    counting = Counting(LocalStorage(Path(tempfile.mkdtemp()) / "lake"))
    lake, spark = Lake(counting), OnDemand(no_spark, "local[2]")
    walls: dict[int, float] = {}
    calls: dict[int, Counter] = {}
    last = max(args.rounds, *(mark + WINDOW - 1 for mark in marks))
    for number in range(1, last + 1):
        land(lake, (number - 1) * args.records, args.records)
        counting.clear()
        started = time.perf_counter()
        project(lake, spark, TAP, STREAM)
        walls[number] = time.perf_counter() - started
        calls[number] = Counter(KINDS[method] for method, _ in counting.requests)
    print(f"Long run, local lake: {last} rounds of {args.records} new records landed, then project (median of {WINDOW} rounds)")
    print(f"{'round':>6}  {'wall s':>7}  {'spread':>13}  {'GET':>4} {'HEAD':>4} {'PUT':>4} {'LIST':>4}  note")
    median = {}
    for mark in marks:
        window = [walls[n] for n in range(mark, mark + WINDOW)]
        median[mark] = statistics.median(window)
        kinds = calls[mark]
        note = "Delta checkpoint" if checkpoint_due(mark - 1) else ""
        print(
            f"{mark:>6}  {median[mark]:>7.3f}  {min(window):.3f}-{max(window):.3f}  "
            f"{kinds['GET']:>4} {kinds['HEAD']:>4} {kinds['PUT']:>4} {kinds['LIST']:>4}  {note}"
        )
    if 10 in median:
        growth = median[marks[-1]] - median[10]
        verdict = "met" if growth <= 0.5 else "NOT met"
        print(f"round {marks[-1]} − round 10: {growth:+.3f} s (goal: within 0.5 s): {verdict}")


if __name__ == "__main__":
    main()
