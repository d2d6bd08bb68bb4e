"""The lake jobs of the ``singerlake`` command (ls, verify, repair, vacuum, compact, project, upgrade,
sql, locks, docs): each runs its job on the lake and gives the result to the command's ``Output``."""

from __future__ import annotations

import argparse
import sys
import time

from singerlake.cli.lakes import check_spark_installed, lake_options, open_lake, start_spark
from singerlake.cli.output import Output
from singerlake.errors import ConfigError
from singerlake.jobs.describe import describe_lake, stream_locks
from singerlake.storage import PreconditionFailed
from singerlake.tables.columns import note, type_label
from singerlake.text import counted

MIB = 1 << 20


def cmd_ls(args: argparse.Namespace, output: Output) -> int:
    from singerlake.changes.view import local_views

    lake = open_lake(args)
    report = describe_lake(lake, local_views(lake.storage))  # this machine's views: ls may only read the lake
    output.result(report, describe_text(report))
    return 0


def describe_text(report: dict) -> str:
    """``ls``: the lake's taps, streams, versions and locks, and its pushed files per what. Locks are shown
    for the streams read this run (the others' were listed on an earlier run: see the JSON's ``locks_read``)."""
    lines = [f"lake {report['root']}"]
    read = [info.get("locks_read") == report.get("read") for streams in report["taps"].values() for info in streams.values()]
    for tap_id, streams in report["taps"].items():
        lines.append(f"  tap {tap_id}")
        for stream, info in streams.items():
            sizes = f"{records_in(info)}, {counted(info['bytes'], 'byte')}, {counted(info['commits'], 'commit')}"
            lines.append(f"    {stream}: {sizes}, {info['start']} .. {info['end']}")
            for version in info["versions"]:
                lines.append(f"      {version['version']} {version['schema_hash']}: {records_in(version)}")
                lines += [f"        {change}" for change in version["changes"]]
            lines += table_text(info.get("table"))
            if info.get("locks_read") == report.get("read"):
                lines += [f"      lock {lock_text(lock)}" for lock in info["locks"]]
    if read:
        lines.append(f"  locks shown of the {counted(sum(read), 'stream')} read this run; `singerlake locks` lists every lock")
    for what, info in report.get("files", {}).items():
        sizes = f"{counted(info['files'], 'file')}, {counted(info['bytes'], 'byte')} in {counted(info['pushes'], 'push', 'pushes')}"
        lines.append(f"  files {what}: {sizes} from {', '.join(info['wheres'])}; days {info['first_day']} .. {info['last_day']}")
    return "\n".join(lines)


def table_text(table: dict | None) -> list[str]:
    """A projected stream's table in a line, then each column a reader should know of (JSON text, chosen types)."""
    if table is None:
        return []
    lines = [f"      table {table['location']}: version {table['version']}, {counted(table['rows'], 'row')}"]
    if "iceberg" in table:
        iceberg = table["iceberg"]
        lines.append(f"      iceberg {iceberg['namespace']}.{iceberg['table']}: {iceberg['metadata_location']}")
    return lines + [f"        {column['name']}: {type_label(column)}" for column in table["columns"] if note(column)]


def records_in(info: dict) -> str:
    return f"{counted(info['records'], 'record')} in {counted(info['files'], 'file')}"


def lock_text(lock: dict) -> str:
    return f"{lock['path']}: {lock['writer_id']}, refreshed {lock['refreshed']}{' (stale)' if lock['stale'] else ''}"


def cmd_verify(args: argparse.Namespace, output: Output) -> int:
    from singerlake.jobs.verify import verify

    lake = open_lake(args)
    spark = None if args.no_hashes else start_spark(args)
    failures: list = []
    findings = verify(lake, spark, check_hashes=not args.no_hashes, progress=output.progress("verify"), failures=failures)
    if findings or failures:
        summary = f"{counted(len(findings), 'problem')} found" + (
            f"; {counted(len(failures), 'stream')} could not be checked" if failures else ""
        )
    else:
        summary = "clean: metadata and storage agree"
    doc = {"clean": not findings and not failures, "findings": [f.to_dict() for f in findings]}
    return output.finish(doc, "\n".join([*map(str, findings), summary]), failures, problems=bool(findings))


def cmd_repair(args: argparse.Namespace, output: Output) -> int:
    from singerlake.jobs.repair import repair

    lake = open_lake(args)
    failures: list = []
    actions = repair(lake, start_spark(args), apply=args.apply, progress=output.progress("repair"), failures=failures)
    verb = "done" if args.apply else "would do (dry run; --apply to change the lake)"
    text = "\n".join([*map(str, actions), f"{counted(len(actions), 'change')} {verb}" if actions else "nothing to repair"])
    return output.finish({"applied": args.apply, "actions": [a.to_dict() for a in actions]}, text, failures)


def cmd_vacuum(args: argparse.Namespace, output: Output) -> int:
    from singerlake.jobs.vacuum import parse_duration, vacuum

    retention = parse_duration(args.retention)
    lake = open_lake(args)
    notes: list[str] = []
    deletions = vacuum(lake, retention, apply=args.apply, force=args.force, iceberg_catalog=args.iceberg_catalog, notes=notes)
    freed = sum(d.size for d in deletions)
    verb = "deleted" if args.apply else "would be deleted (dry run; --apply to delete)"
    lines = [*map(str, deletions), *(f"left for a later pass: {note}" for note in notes)]
    text = "\n".join([*lines, f"{counted(len(deletions), 'file')}, {counted(freed, 'byte')} {verb}"])
    output.result({"applied": args.apply, "deletions": [d.to_dict() for d in deletions], "left": notes}, text)
    return 0


def cmd_compact(args: argparse.Namespace, output: Output) -> int:
    from singerlake.jobs.compact import compact

    lake = open_lake(args)
    failures: list = []
    target_bytes = int(args.target_size_mib * MIB)
    results = compact(
        lake, start_spark(args), args.tap, args.stream, target_bytes=target_bytes, progress=output.progress("compact"), failures=failures
    )
    text = "\n".join(
        f"{r.stream}: {r.files_before:,} -> {counted(r.files_after, 'file')} ({r.groups:,} merged, {counted(r.bytes_merged, 'byte')})"
        for r in results
    )
    return output.finish({"streams": [r.to_dict() for r in results]}, text or "no streams", failures)


def cmd_project(args: argparse.Namespace, output: Output) -> int:
    check_spark_installed(args)  # first: the projection imports Spark's types, though a small run may not start it
    from singerlake.spark.session import OnDemand
    from singerlake.tables.project import check_formats, project

    lake = open_lake(args)
    failures: list = []
    formats = args.formats.split(",")
    check_formats(lake, formats, args.iceberg_catalog)  # before Spark starts: a wrong format or catalog fails at once
    results = project(
        lake,
        OnDemand(lambda: start_spark(args), args.spark_master, args.spark_remote),
        args.tap,
        args.stream,
        formats=formats,
        progress=output.progress("project"),
        failures=failures,
        hard_delete=args.hard_delete,
        iceberg_catalog=args.iceberg_catalog,
        types=args.types,
        partition_by=args.partition_by,
        rebuild=args.rebuild,
    )
    return output.finish({"streams": results}, "\n".join(map(projected_text, results)) or "nothing new to project", failures)


def projected_text(result: dict) -> str:
    """A stream's projection in a line, and its Iceberg table's name and metadata location when it has one."""
    text = f"{result['stream']}: {counted(result['new_records'], 'new record')}, {counted(result['rows'], 'current row')}"
    text += f" -> {result['table']} (version {result['version']})"
    if result.get("csv"):
        text += f", {counted(len(result['csv']), 'CSV file')}"
    if "iceberg" in result:
        iceberg = result["iceberg"]
        text += f"\n  iceberg {iceberg['namespace']}.{iceberg['table']}: {iceberg['metadata_location']}"
    return text


def cmd_upgrade(args: argparse.Namespace, output: Output) -> int:
    from singerlake.jobs.upgrade import upgrade

    lake = open_lake(args)
    failures: list = []
    upgrades = upgrade(lake, apply=args.apply, failures=failures, spark=lambda: start_spark(args))
    verb = "upgraded" if args.apply else "to upgrade (dry run; --apply to convert)"
    summary = (
        f"{counted(len(upgrades), 'stream')} {verb}" if upgrades else "nothing to upgrade: every manifest is 2.0, with column statistics"
    )
    text = "\n".join([*map(str, upgrades), summary])
    return output.finish({"applied": args.apply, "streams": [u.to_dict() for u in upgrades]}, text, failures)


def cmd_sql(args: argparse.Namespace, output: Output) -> int:
    from singerlake.tables.sql import SqlSession, chosen_tap, run_query

    lake = open_lake(args)
    if args.query is not None:
        columns, rows = run_query(lake, start_spark(args), args.query, tap_id=args.tap, raw=args.raw, types=args.types)
        output.rows(columns, rows)
        return 0
    from singerlake.cli.shell import Shell, quiet, run_interactive, run_piped

    tap_id = chosen_tap(lake, args.tap)  # a wrong tap fails before Spark starts
    interactive = sys.stdin.isatty()
    if interactive:
        output.note("singerlake sql: starting Spark...")
    started = time.perf_counter()
    spark = start_spark(args)
    quiet(spark)
    session = SqlSession(lake, spark, tap_id, raw=args.raw, types=args.types)
    shell = Shell(session, mode=output.mode, out=output.out, err=output.err)
    if not interactive:
        return run_piped(shell, sys.stdin)
    views = f"{counted(len(session.streams), 'stream')} of {tap_id} as views ({'every record' if args.raw else 'current rows'})"
    return run_interactive(shell, f"Spark started in {time.perf_counter() - started:.1f} s; {views}. End statements with ; .help for help")


def cmd_locks(args: argparse.Namespace, output: Output) -> int:
    lake = open_lake(args)
    locks = [lock for tap in lake.taps() for stream in lake.streams(tap) for lock in stream_locks(lake, tap, stream)]
    if args.break_lock:
        if not args.force:
            raise ConfigError("breaking a lock can let two writers commit at once: add --force if its writer is really gone")
        if args.break_lock not in {lock["path"] for lock in locks}:  # only a lock: never a manifest or data file
            raise ConfigError(f"--break {args.break_lock}: not a lock held in this lake (`singerlake locks` lists them)")
        try:
            etag = lake.storage.read_etag(args.break_lock)
            lake.storage.delete(args.break_lock, if_match=etag)
        except PreconditionFailed:
            raise ConfigError(f"{args.break_lock} changed while breaking it (its writer is alive): not broken") from None
        output.result({"broken": args.break_lock}, f"broke {args.break_lock}")
        return 0
    text = "\n".join(map(lock_text, locks))
    output.result(locks, text or "no locks")
    return 0


def cmd_docs(args: argparse.Namespace, output: Output) -> int:
    from singerlake.site.pages import SITE_PREFIX, VerifyResult, build_site, write_site
    from singerlake.storage import open_storage

    if not args.out and not args.publish:
        raise ConfigError("say where the site goes: --out DIR, --publish (under the lake root's docs/), or both")
    lake = open_lake(args, files=True)  # a lake of pushed files alone has a site too
    verified = None
    if args.verify:
        from singerlake.jobs.verify import verify

        spark = None if args.no_hashes else start_spark(args)
        checked: list = []
        findings = verify(lake, spark, check_hashes=not args.no_hashes, progress=output.progress("verify"), failures=checked)
        verified = VerifyResult(findings, checked)
    sites = [(open_storage(args.out, **lake_options(args)), "", args.out)] if args.out else []
    sites += [(lake.storage, SITE_PREFIX, lake.storage.url_of(SITE_PREFIX))] if args.publish else []
    site = build_site(lake, verified, view_of=lambda tap: site_view(sites, lake, tap))
    for storage, prefix, _ in sites:
        write_site(site, storage, prefix, lake.storage.url)
    places = [place for _, _, place in sites]
    whats = f", {counted(site.whats, 'what')} of files" if site.whats else ""
    text = f"{counted(len(site.pages), 'page')} ({counted(site.streams, 'stream')}{whats}) written to {' and '.join(places)}"
    if site.read < site.streams:
        text += f"; {counted(site.read, 'stream')} read, the pages of the others unchanged"
    doc = {"pages": len(site.pages), "streams": site.streams, "read": site.read, "whats": site.whats, "written_to": places}
    return output.finish(doc, text, site.problems)


def site_view(sites: list, lake, tap_id: str):
    """The tap's view kept beside the site (``docs``); with two sites, only one both kept alike."""
    from singerlake.changes.view import read_view, view_key

    views = [read_view(storage, prefix + view_key("", tap_id), "docs", lake.storage.url, tap_id) for storage, prefix, _ in sites]
    return views[0] if all(view == views[0] for view in views) else None
