"""The files commands of ``singerlake`` (SPEC.md §14): push files, find them (files), fetch them back;
what they did goes to the command's ``Output``, the fetched bytes of ``fetch --out -`` to its data stream."""

from __future__ import annotations

import argparse
import difflib
from typing import BinaryIO

from singerlake.cli.lakes import lake_options, open_files_lake, start_push_spark
from singerlake.cli.output import Output, fetched_text, printable
from singerlake.errors import ConfigError
from singerlake.files.record import whats_of
from singerlake.lake import Lake
from singerlake.text import counted


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
    lines.append(f"{counted(len(result.pushed), 'file')} pushed, {len(result.duplicates):,} already in the lake")
    output.result(result.to_dict(), "\n".join(lines))
    return 0


FILE_COLUMNS = ["id", "what", "where", "start_iso", "end_iso", "work_id", "size", "name"]


def cmd_files(args: argparse.Namespace, output: Output) -> int:
    lake = open_files_lake(args)
    if args.latest:
        if args.start or args.end or args.work_id:
            raise ConfigError("--latest takes no --start, --end or --work-id")
        records = [r for what in whats_of(args.what) if (r := lake.latest_file(what, args.where)) is not None]
    elif args.work_id is not None:
        if args.start or args.end:
            raise ConfigError("give either --work-id or --start/--end, not both")
        records = lake.find_files(args.what, where=args.where, work_id=args.work_id)
    elif args.start is not None:
        records = lake.find_files(args.what, where=args.where, start=args.start, end=args.end)
    else:
        raise ConfigError("say which files: --start T [--end T], --work-id ID or --latest")
    outcomes = fetch_files(lake, records, args.fetch + "/", args) if args.fetch else []
    output.records(records, FILE_COLUMNS)
    if not records and (hint := unknown_labels(lake, whats_of(args.what), args.where)):
        output.note(f"singerlake files: {hint}")
    return output.fetched(outcomes)


def unknown_labels(lake: Lake, whats: list[str], where: str) -> str | None:
    """Why a query found nothing, when it asked for a what the lake does not have, or a where none of
    its whats has: which ones there are, the closest first."""
    known = lake.file_whats()
    unknown = [what for what in whats if what not in known]
    if unknown:
        return f"no what {', '.join(unknown)} in this lake; {choices('whats', unknown[0], known)}"
    wheres = sorted({found for what in whats for found in lake.file_wheres(what)})
    if where and not any(found.startswith(where) for found in wheres):
        return f"no where starting with {where} in {', '.join(whats)}; {choices('wheres', where, wheres)}"
    return None


def choices(kind: str, typed: str, known: list[str], shown: int = 5) -> str:
    """``did you mean x? whats: x, y, z (12 in all)``: the closest to ``typed`` first."""
    if not known:
        return f"it holds no {kind}"
    close = difflib.get_close_matches(typed, known, n=shown, cutoff=0.6)
    listed = [*close, *(name for name in known if name not in close)][:shown]
    more = f" ({len(known)} in all)" if len(known) > shown else ""
    return (f"did you mean {close[0]}? " if close else "") + f"{kind}: {', '.join(listed)}{more}"


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
