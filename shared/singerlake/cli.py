"""The ``singerlake`` command: lake jobs. Every command takes the lake root first."""

from __future__ import annotations

import argparse
import json
import sys

from singerlake.lake import Lake
from singerlake.storage import StorageError


def describe_lake(lake: Lake) -> dict:
    """Taps, streams, versions, files, records and bytes, from the metadata (or a scan)."""
    taps = {}
    for tap_id in lake.taps():
        streams = {}
        for stream in lake.streams(tap_id):
            manifest = lake.manifest(tap_id, stream)
            streams[stream] = {
                "versions": {info["version"]: schema_hash for schema_hash, info in manifest.versions.items()},
                "files": len(manifest.files),
                "records": sum(f["records"] for f in manifest.files),
                "bytes": sum(f["size"] for f in manifest.files),
                "commits": manifest.commits,
            }
        taps[tap_id] = streams
    return {"root": lake.storage.url, "taps": taps}


def cmd_ls(args: argparse.Namespace) -> int:
    lake = Lake.open(args.root)
    lake.check_exists()
    report = describe_lake(lake)
    if args.json:
        print(json.dumps(report, indent=1, ensure_ascii=False))
        return 0
    print(f"lake {report['root']}")
    for tap_id, streams in report["taps"].items():
        print(f"  tap {tap_id}")
        for stream, info in streams.items():
            versions = ", ".join(f"{label}={h}" for label, h in info["versions"].items())
            print(
                f"    {stream}: {info['records']} records in {info['files']} files, "
                f"{info['bytes']} bytes, {info['commits']} commits; versions {versions}"
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="singerlake", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("ls", help="list taps, streams, versions, files and records")
    ls.add_argument("root", help="lake root: a path, file:// or s3:// URL")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(run=cmd_ls)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (StorageError, LookupError, ValueError) as exc:
        print(f"singerlake {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
