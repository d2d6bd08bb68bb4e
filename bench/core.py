"""Core benchmark: data-file writes against plain gzip of the same bytes, and manifest commits.

The target and tap benchmarks against their PyPI peers are added with issues #3 and #4.
Usage: python bench/core.py [--records N]
"""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
import time

from singerlake.commits.commit import commit_files
from singerlake.format.datafile import write_data_file
from singerlake.format.layout import StreamPaths
from singerlake.storage import LocalStorage


def lines(n: int) -> list[bytes]:
    return [
        json.dumps({"type": "RECORD", "stream": "users", "record": {"id": i, "name": f"user {i}", "score": i / 7}}).encode()
        for i in range(n)
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--commits", type=int, default=200)
    args = parser.parse_args()
    records = lines(args.records)
    schema = {"type": "object", "properties": {"id": {"type": "integer"}}}
    schema_line = json.dumps({"type": "SCHEMA", "stream": "users", "schema": schema, "key_properties": []}).encode()
    with tempfile.TemporaryDirectory() as tmp:
        storage = LocalStorage(tmp)
        paths = StreamPaths("bench", "users")
        started = time.perf_counter()
        with gzip.open(f"{tmp}/peer.gz", "wb", compresslevel=6) as handle:
            handle.write(b"\n".join([schema_line, *records]) + b"\n")
        peer_s = time.perf_counter() - started
        started = time.perf_counter()
        write_data_file(storage, paths, "0000000000000", schema_line, records, list(range(len(records))))
        ours_s = time.perf_counter() - started
        small = [write_data_file(storage, paths, "0000000000000", schema_line, records[:1], [0]) for _ in range(args.commits)]
        started = time.perf_counter()
        for record in small:
            commit_files(storage, paths, [record], {"0000000000000": (schema, [])})
        commit_s = time.perf_counter() - started
    print(f"{'measure':<42}{'value':>12}")
    print(f"{'plain gzip.open write (peer), s':<42}{peer_s:>12.3f}")
    print(f"{'singerlake write_data_file, s':<42}{ours_s:>12.3f}")
    print(f"{'ratio singerlake / peer':<42}{ours_s / peer_s:>12.2f}")
    print(f"{'manifest commits/s (local, growing)':<42}{args.commits / commit_s:>12.1f}")


if __name__ == "__main__":
    main()
