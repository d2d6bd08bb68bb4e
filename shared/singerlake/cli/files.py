"""The files commands of ``singerlake`` (SPEC.md §14): push files, find them (files), fetch them back;
what they did goes to the command's ``Output``, the fetched bytes of ``fetch --out -`` to its data stream."""

from __future__ import annotations

import argparse
from typing import BinaryIO

from singerlake.cli.lakes import lake_options, open_files_lake, start_push_spark
from singerlake.cli.output import Output, fetched_text, printable
from singerlake.errors import ConfigError
from singerlake.lake import Lake


def cmd_push(args: argparse.Namespace, output: Output) -> int:
    lake = Lake.open(args.root, **lake_options(args))
    show = output.push_progress()
    use_spark = "always" if args.spark == "auto" and (args.spark_master or args.spark_remote) else args.spark
    spark = None if use_spark == "never" else lambda: start_push_spark(args, lake)  # started only for a push that runs on it
    result = lake.push(
        args.paths, what=args.what, where=args.where, work_id=args.work_id, start=args.start, end=args.end,
        progress=show, spark=spark, use_spark=use_spark,
    )  # fmt: skip
    lines = [f"pushed {r['id']} {printable(r['path'])} ({r['size']:,} bytes)" for r in result.pushed]
    lines += [f"already in the lake as {r['id']}: {printable(r['path'])}" for r in result.duplicates]
    lines.append(f"{len(result.pushed)} file(s) pushed, {len(result.duplicates)} already in the lake")
    output.result(result.to_dict(), "\n".join(lines))
    return 0


FILE_COLUMNS = ["id", "what", "where", "start_iso", "end_iso", "work_id", "size", "name"]


def cmd_files(args: argparse.Namespace, output: Output) -> int:
    lake = open_files_lake(args)
    whats = [w for w in args.what.split(",") if w]
    if args.latest:
        if args.start or args.end or args.work_id:
            raise ConfigError("--latest takes no --start, --end or --work-id")
        records = [r for what in whats if (r := lake.latest_file(what, args.where)) is not None]
    elif args.work_id is not None:
        if args.start or args.end:
            raise ConfigError("give either --work-id or --start/--end, not both")
        records = lake.find_files(whats, where=args.where, work_id=args.work_id)
    elif args.start is not None:
        records = lake.find_files(whats, where=args.where, start=args.start, end=args.end)
    else:
        raise ConfigError("say which files: --start T [--end T], --work-id ID or --latest")
    outcomes = fetch_files(lake, records, args.fetch + "/", args) if args.fetch else []
    output.records(records, FILE_COLUMNS)
    return output.fetched(outcomes)


def cmd_fetch(args: argparse.Namespace, output: Output) -> int:
    lake = open_files_lake(args)
    outcomes = fetch_files(lake, args.ids, output.data if args.out == "-" else args.out, args)
    if args.out != "-":
        output.result([o.to_dict() for o in outcomes], fetched_text(outcomes))
    return output.fetched(outcomes)


def fetch_files(lake: Lake, files: list, out: str | BinaryIO | None, args: argparse.Namespace) -> list:
    """What became of each file fetched (``files.fetch.Fetched``), those that failed too; ``out`` a
    path, a directory, or a stream the files' bytes are written to one after another."""
    from singerlake.files.errors import FetchFailed

    try:
        return lake.fetch(files, out, args.name, overwrite=args.overwrite)
    except FetchFailed as exc:
        return exc.outcomes
