"""The ``singerlake`` command: lake jobs. Every command takes the lake root first.

S3 roots use the standard AWS configuration (environment, profile) plus --s3-* options.
Jobs that read many files (verify, repair, compact, project) and sql run on Spark (--spark-master, default
local[*]): one Spark job for all the streams they cover (project: plus a few per stream over
64 MiB). A stream that fails does not stop the others: each failed stream is reported on stderr,
one line naming its tap, its stream and the cause, and in --json output under "failures".

Exit codes: 0 success (verify: clean); 1 verify found problems, or some streams failed (the
others finished); 2 an error that is no stream's: usage or configuration (bad arguments, lake
root, tap) or the lake's own metadata (an unreadable catalogue or singerlake.json).
"""

from __future__ import annotations

import argparse
import json
import sys

from singerlake.describe import describe_lake, describe_text, stream_locks
from singerlake.lake import Lake
from singerlake.metadata import InvalidMetadata
from singerlake.storage import PreconditionFailed, StorageError

MIB = 1 << 20


def open_lake(args: argparse.Namespace) -> Lake:
    options = {"region": args.s3_region, "profile": args.s3_profile, "endpoint_url": args.s3_endpoint_url}
    lake = Lake.open(args.root, **options)
    lake.check_exists()
    return lake


def start_spark(args: argparse.Namespace):
    from singerlake.spark import spark_session

    return spark_session(master=args.spark_master, app_name=f"singerlake {args.command}")


def progress(args: argparse.Namespace, label: str):
    from singerlake.jobs import Progress

    return Progress(label, enabled=False if args.json else None)


def emit(args: argparse.Namespace, doc, text: str) -> None:
    print(json.dumps(doc, indent=1, ensure_ascii=False) if args.json else text)


def finish(args: argparse.Namespace, doc: dict, text: str, failures: list, problems: bool = False) -> int:
    """Print a stream job's result with its failed streams (one line each on stderr, and in the JSON
    document); exit 1 when a stream failed (or ``problems``), else 0."""
    emit(args, {**doc, "failures": [f.to_dict() for f in failures]}, text)
    for failure in failures:
        print(f"singerlake {args.command}: failed: {failure}", file=sys.stderr)
    if failures:
        print(f"singerlake {args.command}: {len(failures)} stream(s) failed; the others finished", file=sys.stderr)
    return 1 if failures or problems else 0


# -- commands ------------------------------------------------------------------------------------
def cmd_ls(args: argparse.Namespace) -> int:
    report = describe_lake(open_lake(args))
    emit(args, report, describe_text(report))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from singerlake.verify import verify

    lake = open_lake(args)
    spark = None if args.no_hashes else start_spark(args)
    failures: list = []
    findings = verify(lake, spark, check_hashes=not args.no_hashes, progress=progress(args, "verify"), failures=failures)
    if findings or failures:
        summary = f"{len(findings)} problem(s) found" + (f"; {len(failures)} stream(s) could not be checked" if failures else "")
    else:
        summary = "clean: metadata and storage agree"
    doc = {"clean": not findings and not failures, "findings": [f.to_dict() for f in findings]}
    return finish(args, doc, "\n".join([*map(str, findings), summary]), failures, problems=bool(findings))


def cmd_repair(args: argparse.Namespace) -> int:
    from singerlake.repair import repair

    lake = open_lake(args)
    failures: list = []
    actions = repair(lake, start_spark(args), apply=args.apply, progress=progress(args, "repair"), failures=failures)
    verb = "done" if args.apply else "would do (dry run; --apply to change the lake)"
    text = "\n".join([*map(str, actions), f"{len(actions)} change(s) {verb}" if actions else "nothing to repair"])
    return finish(args, {"applied": args.apply, "actions": [a.to_dict() for a in actions]}, text, failures)


def cmd_vacuum(args: argparse.Namespace) -> int:
    from singerlake.vacuum import parse_duration, vacuum

    lake = open_lake(args)
    deletions = vacuum(lake, parse_duration(args.retention), apply=args.apply)
    freed = sum(d.size for d in deletions)
    verb = "deleted" if args.apply else "would be deleted (dry run; --apply to delete)"
    text = "\n".join([*map(str, deletions), f"{len(deletions)} file(s), {freed:,} bytes {verb}"])
    emit(args, {"applied": args.apply, "deletions": [d.to_dict() for d in deletions]}, text)
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    from singerlake.compact import compact

    lake = open_lake(args)
    failures: list = []
    target_bytes = int(args.target_size_mib * MIB)
    results = compact(
        lake, start_spark(args), args.tap, args.stream, target_bytes=target_bytes, progress=progress(args, "compact"), failures=failures
    )
    text = "\n".join(
        f"{r.stream}: {r.files_before:,} -> {r.files_after:,} files ({r.groups} merged, {r.bytes_merged:,} bytes)" for r in results
    )
    return finish(args, {"streams": [r.to_dict() for r in results]}, text or "no streams", failures)


def cmd_project(args: argparse.Namespace) -> int:
    from singerlake.project import project

    lake = open_lake(args)
    failures: list = []
    formats = args.formats.split(",")
    results = project(
        lake, start_spark(args), args.tap, args.stream, formats=formats, progress=progress(args, "project"), failures=failures
    )
    text = "\n".join(
        f"{r['stream']}: {r['new_records']:,} new records, {r['rows']:,} current rows -> {r['table']} (version {r['version']})"
        for r in results
    )
    return finish(args, {"streams": results}, text or "no streams", failures)


def cmd_sql(args: argparse.Namespace) -> int:
    from singerlake.sql import as_csv, as_json, as_table, run_query

    lake = open_lake(args)
    columns, rows = run_query(lake, start_spark(args), args.query, tap_id=args.tap, raw=args.raw)
    print((as_csv if args.csv else as_json if args.json else as_table)(columns, rows))
    return 0


def cmd_locks(args: argparse.Namespace) -> int:
    lake = open_lake(args)
    locks = [lock for tap in lake.taps() for stream in lake.streams(tap) for lock in stream_locks(lake, tap, stream)]
    if args.break_lock:
        if not args.force:
            raise ValueError("breaking a lock can let two writers commit at once: add --force if its writer is really gone")
        try:
            etag = lake.storage.read_etag(args.break_lock)
            lake.storage.delete(args.break_lock, if_match=etag)
        except PreconditionFailed:
            raise ValueError(f"{args.break_lock} changed while breaking it (its writer is alive): not broken") from None
        emit(args, {"broken": args.break_lock}, f"broke {args.break_lock}")
        return 0
    text = "\n".join(
        f"{lock['path']}: {lock['writer_id']}, refreshed {lock['refreshed']}{' (stale)' if lock['stale'] else ''}" for lock in locks
    )
    emit(args, locks, text or "no locks")
    return 0


def parser() -> argparse.ArgumentParser:
    main_parser = argparse.ArgumentParser(prog="singerlake", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = main_parser.add_subparsers(dest="command", required=True)

    def command(name: str, run, help_text: str, aliases: tuple[str, ...] = ()) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help_text, aliases=list(aliases))
        cmd.add_argument("root", help="lake root: a path, file:// or s3:// URL")
        cmd.add_argument("--json", action="store_true", help="machine-readable output, no progress")
        cmd.add_argument("--s3-endpoint-url")
        cmd.add_argument("--s3-region")
        cmd.add_argument("--s3-profile")
        cmd.add_argument("--spark-master", default="local[*]", help="Spark master for jobs (default local[*])")
        cmd.set_defaults(run=run)
        return cmd

    command("ls", cmd_ls, "taps, streams, versions (with diffs), files, records, bytes, time span, locks", aliases=("describe",))
    verify = command("verify", cmd_verify, "compare metadata with storage; exit 0 only when clean")
    verify.add_argument("--no-hashes", action="store_true", help="skip reading files to check their blake2 hashes")
    repair = command("repair", cmd_repair, "rebuild missing or invalid manifests, catalogues and singerlake.json (dry run by default)")
    repair.add_argument("--apply", action="store_true")
    vacuum = command("vacuum", cmd_vacuum, "delete orphans and replaced files older than the retention (dry run by default)")
    vacuum.add_argument("--retention", default="7d", help="minimum age, e.g. 7d, 12h, 30m (default 7d)")
    vacuum.add_argument("--apply", action="store_true")
    for name, run, text in (
        ("compact", cmd_compact, "merge small files of each stream-schema"),
        ("project", cmd_project, "raw -> staging/ and published/"),
    ):
        cmd = command(name, run, text)
        cmd.add_argument("--tap", help="only this tap")
        cmd.add_argument("--stream", help="only this stream (with --tap)")
    sub.choices["compact"].add_argument("--target-size-mib", type=float, default=128, help="size of merged files (default 128)")
    sub.choices["project"].add_argument(
        "--formats", default="delta", help="delta (always) and optionally csv: a CSV twin of each published file (default delta)"
    )
    sql = command("sql", cmd_sql, "Spark SQL over a tap's streams: each a view of its current rows (--raw: every record)")
    sql.add_argument("query", help="a Spark SQL query; stream names as views, quoted with backticks where needed")
    sql.add_argument("--tap", help="the tap whose streams are the views (required when the lake has several)")
    sql.add_argument("--raw", action="store_true", help="views of every landed record with its position columns")
    sql.add_argument("--csv", action="store_true", help="CSV output: a header row, then the rows")
    locks = command("locks", cmd_locks, "list locks; --break PATH --force removes one")
    locks.add_argument("--break", dest="break_lock", metavar="PATH", help="lock file to remove (as listed)")
    locks.add_argument("--force", action="store_true")
    return main_parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except (StorageError, LookupError, ValueError, InvalidMetadata) as exc:
        print(f"singerlake {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
