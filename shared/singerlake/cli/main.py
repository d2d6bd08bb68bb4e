"""The ``singerlake`` command: lake jobs. Every command takes the lake root first.

S3 roots use the standard AWS configuration (environment, profile) plus --s3-* options.
Jobs that read many files (verify, repair, compact, project) and sql run on Spark: local[*] by
default, a cluster with --spark-master, Spark Connect with --spark-remote sc://... (or $SPARK_REMOTE),
more settings with --spark-conf KEY=VALUE. One Spark job covers all the streams they work on
(project: plus a few per stream over 64 MiB). A stream that fails does not stop the others: each failed stream is reported on stderr,
one line naming its tap, its stream and the cause, and in --json output under "failures".

Exit codes: 0 success (verify: clean); 1 verify found problems, or some streams failed (the
others finished), or some files could not be fetched (the others were); 2 an error that is no
stream's: usage or configuration (bad arguments, lake root, tap), an unreachable lake or the
lake's own metadata (an unreadable catalogue or singerlake.json). Errors are one line on stderr;
--debug adds the traceback.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

import singerlake
from singerlake.cli.output import (
    JobProgress,
    as_csv,
    as_json,
    as_table,
    emit,
    fetched_text,
    finish,
    printable,
    push_progress,
    report_fetched,
)
from singerlake.errors import ConfigError, run_command
from singerlake.jobs.describe import describe_lake, describe_text, stream_locks
from singerlake.lake import Lake
from singerlake.storage import PreconditionFailed, s3_options

MIB = 1 << 20


def open_lake(args: argparse.Namespace, files: bool = False) -> Lake:
    """The lake of a lake job: it must hold landed data (raw/); with ``files``, pushed files (files/) will do too."""
    if files:
        lake = open_files_lake(args)
    else:
        lake = Lake.open(args.root, **lake_options(args))
        lake.check_is_lake()
    if getattr(args, "spark_conf", None) is not None:  # a command that runs Spark jobs
        check_lake_reachable(args, lake)
    return lake


def lake_options(args: argparse.Namespace) -> dict:
    """The storage options of the command line's ``--s3-*`` options."""
    return s3_options(lambda name: getattr(args, name, None))


def check_spark_installed(args: argparse.Namespace) -> dict:
    """The ``--spark-conf`` settings, once Spark is known to be installed."""
    if importlib.util.find_spec("pyspark") is None:  # the core alone (a tap's install) has no Spark
        hint = ", or add --no-hashes" if hasattr(args, "no_hashes") else ""
        raise ConfigError(f"singerlake {args.command} runs on Spark, which is not installed: pip install 'singerlake[spark]'{hint}")
    from singerlake.spark.placement import conf_of_options

    return conf_of_options(args.spark_conf)


def start_spark(args: argparse.Namespace):
    from singerlake.spark.session import spark_session

    conf = check_spark_installed(args)
    return spark_session(master=args.spark_master, remote=args.spark_remote, conf=conf, app_name=f"singerlake {args.command}")


def check_lake_reachable(args: argparse.Namespace, lake: Lake) -> None:
    """A lake on this machine's disk cannot be worked on by executors elsewhere, unless it is shared."""
    from singerlake.spark.placement import check_lake_reachable

    check_lake_reachable(lake.storage, args.root, shared=args.lake_root_shared, master=args.spark_master, remote=args.spark_remote)


def progress(args: argparse.Namespace, label: str):
    """A job's progress line on a terminal; none with ``--json`` or when stderr is not a terminal."""
    return None if args.json or not sys.stderr.isatty() else JobProgress(label)


# -- commands ------------------------------------------------------------------------------------
def cmd_ls(args: argparse.Namespace) -> int:
    report = describe_lake(open_lake(args))
    emit(args, report, describe_text(report))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from singerlake.jobs.verify import verify

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
    from singerlake.jobs.repair import repair

    lake = open_lake(args)
    failures: list = []
    actions = repair(lake, start_spark(args), apply=args.apply, progress=progress(args, "repair"), failures=failures)
    verb = "done" if args.apply else "would do (dry run; --apply to change the lake)"
    text = "\n".join([*map(str, actions), f"{len(actions)} change(s) {verb}" if actions else "nothing to repair"])
    return finish(args, {"applied": args.apply, "actions": [a.to_dict() for a in actions]}, text, failures)


def cmd_vacuum(args: argparse.Namespace) -> int:
    from singerlake.jobs.vacuum import parse_duration, vacuum

    retention = parse_duration(args.retention)
    lake = open_lake(args)
    notes: list[str] = []
    deletions = vacuum(lake, retention, apply=args.apply, force=args.force, iceberg_catalog=args.iceberg_catalog, notes=notes)
    freed = sum(d.size for d in deletions)
    verb = "deleted" if args.apply else "would be deleted (dry run; --apply to delete)"
    lines = [*map(str, deletions), *(f"left for a later pass: {note}" for note in notes)]
    text = "\n".join([*lines, f"{len(deletions)} file(s), {freed:,} bytes {verb}"])
    emit(args, {"applied": args.apply, "deletions": [d.to_dict() for d in deletions], "left": notes}, text)
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    from singerlake.jobs.compact import compact

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
        progress=progress(args, "project"),
        failures=failures,
        hard_delete=args.hard_delete,
        iceberg_catalog=args.iceberg_catalog,
    )
    text = "\n".join(
        f"{r['stream']}: {r['new_records']:,} new records, {r['rows']:,} current rows -> {r['table']} (version {r['version']})"
        for r in results
    )
    return finish(args, {"streams": results}, text or "no streams", failures)


def cmd_upgrade(args: argparse.Namespace) -> int:
    from singerlake.jobs.upgrade import upgrade

    lake = open_lake(args)
    failures: list = []
    upgrades = upgrade(lake, apply=args.apply, failures=failures, spark=lambda: start_spark(args))
    verb = "upgraded" if args.apply else "to upgrade (dry run; --apply to convert)"
    summary = f"{len(upgrades)} stream(s) {verb}" if upgrades else "nothing to upgrade: every manifest is 2.0, with column statistics"
    text = "\n".join([*map(str, upgrades), summary])
    return finish(args, {"applied": args.apply, "streams": [u.to_dict() for u in upgrades]}, text, failures)


def cmd_sql(args: argparse.Namespace) -> int:
    from singerlake.tables.sql import SqlSession, chosen_tap, run_query

    lake = open_lake(args)
    if args.query is not None:
        columns, rows = run_query(lake, start_spark(args), args.query, tap_id=args.tap, raw=args.raw)
        print((as_csv if args.csv else as_json if args.json else as_table)(columns, rows))
        return 0
    from singerlake.cli.shell import Shell, quiet, run_interactive, run_piped

    tap_id = chosen_tap(lake, args.tap)  # a wrong tap fails before Spark starts
    interactive = sys.stdin.isatty()
    if interactive:
        print("singerlake sql: starting Spark...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    spark = start_spark(args)
    quiet(spark)
    session = SqlSession(lake, spark, tap_id, raw=args.raw)
    shell = Shell(session, mode="csv" if args.csv else "json" if args.json else "table")
    if not interactive:
        return run_piped(shell, sys.stdin)
    views = f"{len(session.streams)} stream(s) of {tap_id} as views ({'every record' if args.raw else 'current rows'})"
    return run_interactive(shell, f"Spark started in {time.perf_counter() - started:.1f} s; {views}. End statements with ; .help for help")


def cmd_locks(args: argparse.Namespace) -> int:
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
        emit(args, {"broken": args.break_lock}, f"broke {args.break_lock}")
        return 0
    text = "\n".join(
        f"{lock['path']}: {lock['writer_id']}, refreshed {lock['refreshed']}{' (stale)' if lock['stale'] else ''}" for lock in locks
    )
    emit(args, locks, text or "no locks")
    return 0


def cmd_docs(args: argparse.Namespace) -> int:
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
        findings = verify(lake, spark, check_hashes=not args.no_hashes, progress=progress(args, "verify"), failures=checked)
        verified = VerifyResult(findings, checked)
    site = build_site(lake, verified)
    places = []
    if args.out:
        write_site(site, open_storage(args.out, **lake_options(args)))
        places.append(args.out)
    if args.publish:
        write_site(site, lake.storage, SITE_PREFIX)
        places.append(lake.storage.url_of(SITE_PREFIX))
    whats = f", {site.whats} whats of files" if site.whats else ""
    text = f"{len(site.pages)} pages ({site.streams} streams{whats}) written to {' and '.join(places)}"
    return finish(args, {"pages": len(site.pages), "streams": site.streams, "whats": site.whats, "written_to": places}, text, site.problems)


def open_files_lake(args: argparse.Namespace) -> Lake:
    """A lake to query or fetch files from: it must exist and hold files or landed data."""
    lake = Lake.open(args.root, **lake_options(args))
    lake.check_exists()
    if not {"files", "raw"} & set(lake.storage.list_dirs("")):
        raise ConfigError(f"lake root {args.root} holds no lake: it has neither files/ nor raw/")
    return lake


def cmd_push(args: argparse.Namespace) -> int:
    lake = Lake.open(args.root, **lake_options(args))
    show = None if args.json else push_progress()
    use_spark = "always" if args.spark == "auto" and (args.spark_master or args.spark_remote) else args.spark
    spark = None if use_spark == "never" else lambda: start_push_spark(args, lake)  # started only for a push that runs on it
    result = lake.push(
        args.paths, what=args.what, where=args.where, work_id=args.work_id, start=args.start, end=args.end,
        progress=show, spark=spark, use_spark=use_spark,
    )  # fmt: skip
    lines = [f"pushed {r['id']} {printable(r['path'])} ({r['size']:,} bytes)" for r in result.pushed]
    lines += [f"already in the lake as {r['id']}: {printable(r['path'])}" for r in result.duplicates]
    lines.append(f"{len(result.pushed)} file(s) pushed, {len(result.duplicates)} already in the lake")
    emit(args, result.to_dict(), "\n".join(lines))
    return 0


def start_push_spark(args: argparse.Namespace, lake: Lake):
    """The session a push runs on, once the executors are known to reach the lake and the pushed files."""
    from singerlake.spark.placement import check_files_reachable

    check_lake_reachable(args, lake)
    check_files_reachable(shared=args.source_shared, master=args.spark_master, remote=args.spark_remote)
    return start_spark(args)


FILE_COLUMNS = ["id", "what", "where", "start_iso", "end_iso", "work_id", "size", "name"]


def cmd_files(args: argparse.Namespace) -> int:
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
    if args.json:
        print(json.dumps(records, indent=1, ensure_ascii=False))
    else:
        print(as_table(FILE_COLUMNS, [tuple(r[c] for c in FILE_COLUMNS) for r in records]))
    return report_fetched(args, outcomes)


def cmd_fetch(args: argparse.Namespace) -> int:
    lake = open_files_lake(args)
    outcomes = fetch_files(lake, args.ids, args.out, args)
    if args.out != "-":
        emit(args, [o.to_dict() for o in outcomes], fetched_text(outcomes))
    return report_fetched(args, outcomes)


def fetch_files(lake: Lake, files: list, out: str | None, args: argparse.Namespace) -> list:
    """What became of each file fetched (``files.fetch.Fetched``), those that failed too."""
    from singerlake.files.fetch import FetchFailed

    try:
        return lake.fetch(files, out, args.name, overwrite=args.overwrite)
    except FetchFailed as exc:
        return exc.outcomes


def parser() -> argparse.ArgumentParser:
    main_parser = argparse.ArgumentParser(prog="singerlake", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    main_parser.add_argument("--version", action="version", version=f"singerlake {singerlake.__version__}")
    main_parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = main_parser.add_subparsers(dest="command", required=True)

    def command(name: str, run, help_text: str, aliases: tuple[str, ...] = (), spark: bool = False) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help_text, description=help_text, aliases=list(aliases))
        cmd.add_argument("root", help="lake root: a path, file:// or s3:// URL")
        cmd.add_argument("--json", action="store_true", help="machine-readable output, no progress")
        cmd.add_argument("--s3-endpoint-url", metavar="URL", help="S3-compatible endpoint (MinIO, SeaweedFS...); default AWS")
        cmd.add_argument("--s3-region", metavar="REGION", help="S3 region (default: the AWS configuration's)")
        cmd.add_argument("--s3-profile", metavar="PROFILE", help="AWS profile to take credentials from (default: the standard chain)")
        cmd.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
        if spark:
            add_spark_options(cmd)
        cmd.set_defaults(run=run)
        return cmd

    command("ls", cmd_ls, "taps, streams, versions (with diffs), files, records, bytes, time span, locks", aliases=("describe",))
    verify = command("verify", cmd_verify, "compare metadata with storage; exit 0 only when clean", spark=True)
    verify.add_argument("--no-hashes", action="store_true", help="skip reading files to check their blake2 hashes")
    repair = command(
        "repair", cmd_repair, "rebuild missing or invalid manifests, catalogues and singerlake.json (dry run by default)", spark=True
    )
    repair.add_argument("--apply", action="store_true", help="make the changes (default: only list them)")
    vacuum = command("vacuum", cmd_vacuum, "delete orphans and replaced files older than the retention (dry run by default)")
    vacuum.add_argument("--retention", default="7d", help="minimum age, e.g. 7d, 12h, 30m (default 7d)")
    vacuum.add_argument("--apply", action="store_true", help="delete the files (default: only list them)")
    vacuum.add_argument("--force", action="store_true", help="accept a retention under 1h (readers of older versions may lose files)")
    vacuum.add_argument(
        "--iceberg-catalog", metavar="NAME", help="pyiceberg catalog of the Iceberg tables: their snapshots older than the retention expire"
    )
    for name, run, text in (
        ("compact", cmd_compact, "merge small files of each stream-schema"),
        ("project", cmd_project, "raw -> staging/ and published/"),
    ):
        cmd = command(name, run, text, spark=True)
        cmd.add_argument("--tap", help="only this tap")
        cmd.add_argument("--stream", help="only this stream (with --tap)")
    sub.choices["compact"].add_argument("--target-size-mib", type=float, default=128, help="size of merged files (default 128)")
    sub.choices["project"].add_argument(
        "--formats",
        default="delta",
        help="delta (always), and optionally csv (a CSV twin of each published file) and iceberg (each table also an Iceberg "
        "table in --iceberg-catalog, on the same files) (default delta)",
    )
    sub.choices["project"].add_argument(
        "--iceberg-catalog",
        metavar="NAME",
        help="--formats iceberg: the pyiceberg catalog (.pyiceberg.yaml, PYICEBERG_CATALOG__NAME__*)",
    )
    sub.choices["project"].add_argument(
        "--hard-delete",
        action="store_true",
        help="leave deleted rows (_sdc_deleted_at, ACTIVATE_VERSION) out of the tables (default: keep them, _sdc_deleted_at set)",
    )
    sql = command("sql", cmd_sql, "Spark SQL over a tap's streams: each a view of its current rows (--raw: every record)", spark=True)
    sql.add_argument(
        "query",
        nargs="?",
        help="a Spark SQL query; stream names as views, quoted with backticks where needed. Without one: a shell on one Spark "
        "session (statements end with ;  .help lists its commands), or the statements piped on stdin, one after another",
    )
    sql.add_argument("--tap", help="the tap whose streams are the views (required when the lake has several)")
    sql.add_argument("--raw", action="store_true", help="views of every landed record with its position columns")
    sql.add_argument("--csv", action="store_true", help="CSV output: a header row, then the rows")
    upgrade = command(
        "upgrade", cmd_upgrade, "convert 1.x manifests to lake format 2.0 in place, add column statistics (dry run by default)", spark=True
    )
    upgrade.add_argument("--apply", action="store_true", help="convert the manifests (default: only list them)")
    locks = command("locks", cmd_locks, "list locks; --break PATH --force removes one")
    locks.add_argument("--break", dest="break_lock", metavar="PATH", help="lock file to remove (as listed)")
    locks.add_argument("--force", action="store_true", help="with --break: confirm that the lock's writer is really gone")
    docs = command("docs", cmd_docs, "a static HTML site describing the lake (streams and pushed files), from its metadata", spark=True)
    docs.add_argument("--out", metavar="DIR", help="write the site into this directory (a path, file:// or s3:// URL)")
    docs.add_argument("--publish", action="store_true", help="write the site under the lake root, in docs/")
    docs.add_argument("--verify", action="store_true", help="add each stream's `singerlake verify` findings (hashes on Spark)")
    docs.add_argument("--no-hashes", action="store_true", help="with --verify: compare metadata with listings only, without Spark")
    add_files_commands(command)
    return main_parser


def add_files_commands(command) -> None:
    """push, files and fetch: any file, by what, where, time and work id (SPEC.md §14)."""
    from singerlake.files.push import SPARK_FILES, SPARK_MODES

    push = command("push", cmd_push, "push files (or every file below a directory) with their metadata record")
    push.add_argument("paths", nargs="+", metavar="PATH", help="files or directories to push")
    push.add_argument("--what", required=True, help="the kind of file, ^[a-z0-9_-]+$ (e.g. nginx-access)")
    push.add_argument("--where", required=True, help="where it came from, ^[a-z0-9_-]+$ (e.g. web02-prod)")
    push.add_argument("--work-id", help="an id to find the files by later, ^[a-z0-9_-]+$ (default none)")
    push.add_argument("--start", help=f"time of the first event: {TIME_HELP} (default the file's mtime)")
    push.add_argument("--end", help=f"time of the last event (default none: the file is an instant): {TIME_HELP}")
    push.add_argument(
        "--spark",
        choices=SPARK_MODES,
        default="auto",
        help=f"store the files on Spark executors: auto (default) when there are {SPARK_FILES:,} or more or a --spark-master or "
        "--spark-remote is given, always, or never (a thread pool here)",
    )
    push.add_argument(
        "--source-shared",
        action="store_true",
        help="the pushed paths are mounted at the same path on every executor (NFS...): needed to push on a cluster, whose "
        "executors read the files themselves (a local master shares this disk)",
    )
    add_spark_options(push)
    files = command("files", cmd_files, "the files of a what by time range, work id or latest; --json prints whole records")
    files.add_argument("--what", required=True, help="a what, or several separated by commas")
    files.add_argument("--where", default="", help="only wheres starting with this")
    files.add_argument("--start", help=f"files whose span overlaps --start..--end: {TIME_HELP}")
    files.add_argument("--end", help="end of the range (default now)")
    files.add_argument("--work-id", help="the files pushed with this work id")
    files.add_argument("--latest", action="store_true", help="the file whose data is newest, per what")
    files.add_argument("--fetch", metavar="DIR", help="also fetch every file found into DIR (see --name)")
    files.add_argument("--name", default=None, help=NAME_HELP)
    files.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    fetch = command("fetch", cmd_fetch, "write files back by id, hashes checked")
    fetch.add_argument("ids", nargs="+", metavar="ID", help="file ids, as `singerlake files` lists them")
    fetch.add_argument("--out", default=None, help="a file (one id), a directory, or - for stdout (default: this directory)")
    fetch.add_argument("--name", default=None, help=NAME_HELP)
    fetch.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)


TIME_HELP = "ISO 8601, now, or seconds or ms since the epoch"
NAME_HELP = "file names in a directory, from record fields, e.g. {where}/{what}-{start_iso} (default {id}-{name})"
OVERWRITE_HELP = "replace a file already there with other bytes (default: leave it, and report that file failed)"


def add_spark_options(cmd: argparse.ArgumentParser) -> None:
    """Where a command's Spark jobs run (README, "Running on a cluster")."""
    cmd.add_argument("--spark-master", help="Spark master: local[*] (default), spark://host:7077, k8s://..., yarn")
    cmd.add_argument("--spark-remote", help="Spark Connect server, sc://host:port (default $SPARK_REMOTE)")
    cmd.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting (repeatable)")
    cmd.add_argument(
        "--lake-root-shared",
        action="store_true",
        help="a local lake root that every executor mounts at the same path (NFS...); needed to use one with a cluster",
    )


DEBUG_HELP = "show the traceback of an error (also $SINGERLAKE_DEBUG=1)"


def main(argv: list[str] | None = None) -> int:
    main_parser = parser()
    args, extra = main_parser.parse_known_args(argv)
    if extra and getattr(args, "query", "") is None and len(extra) == 1 and not extra[0].startswith("-"):
        args.query = extra[0]  # `sql ROOT --opt X QUERY`: argparse before 3.12 leaves an optional positional after options unfilled
    elif extra:
        main_parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "stream", None) and not args.tap:
        main_parser.error(f"{args.command}: --stream needs --tap (stream names are per tap)")
    if args.debug:
        os.environ["SINGERLAKE_DEBUG"] = "1"
    return run_command(f"singerlake {args.command}", lambda: args.run(args))


if __name__ == "__main__":
    sys.exit(main())
