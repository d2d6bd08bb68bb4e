"""The ``singerlake`` command: lake jobs. Every command takes the lake root first.

S3 roots use the standard AWS configuration (environment, profile) plus --s3-* options, else
$SINGERLAKE_S3_REGION, _PROFILE, _ENDPOINT_URL, _ACCESS_KEY_ID, _SECRET_ACCESS_KEY, _SESSION_TOKEN.
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
import os
import sys

import singerlake
from singerlake.cli.files import cmd_fetch, cmd_files, cmd_push
from singerlake.cli.jobs import (
    cmd_compact,
    cmd_docs,
    cmd_locks,
    cmd_ls,
    cmd_project,
    cmd_repair,
    cmd_sql,
    cmd_upgrade,
    cmd_vacuum,
    cmd_verify,
)
from singerlake.cli.output import output_for
from singerlake.cli.spark import add_spark_command
from singerlake.errors import BadArgument, ConfigError, run_command
from singerlake.times import BEFORE_NOW

TYPE_HELP = (
    "type one column as TYPE instead of exactly (repeatable): double, long, decimal(p,s), string, boolean, timestamp, date; "
    "e.g. users.score=double. double rounds; a value that does not fit is an error naming it (SPEC.md §12)"
)


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
    sub.choices["project"].add_argument(
        "--partition-by",
        dest="partition_by",
        action="append",
        metavar="STREAM=FIELD[:TRANSFORM],...",
        help="partition a stream's table by record fields, each by identity (the default), year, month, day or hour "
        "(e.g. orders=created_at:day); repeatable, one per stream; give the same on every run",
    )
    sub.choices["project"].add_argument(
        "--rebuild", action="store_true", help="project anew the streams whose --partition-by differs from their table's (one commit each)"
    )
    sql = command("sql", cmd_sql, "Spark SQL over a tap's streams: each a view of its current rows (--raw: every record)", spark=True)
    for cmd in (sub.choices["project"], sql):
        cmd.add_argument("--type", dest="types", action="append", metavar="STREAM.COLUMN=TYPE", help=TYPE_HELP)
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
    add_spark_command(sub)
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
    files.add_argument("--end", help="end of the range (default now; a date alone: the end of that day)")
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


TIME_HELP = "ISO 8601 (a date alone: that whole UTC day), now, today, yesterday, -30m, -2h, -1d, or seconds or ms since the epoch"
NAME_HELP = "file names in a directory, from record fields and {day} (the start's UTC day), e.g. {where}/{day}/{name} (default {id}-{name})"
OVERWRITE_HELP = "replace a file already there with other bytes (default: leave it, and report that file failed)"


def add_spark_options(cmd: argparse.ArgumentParser) -> None:
    """Where a command's Spark jobs run (docs/guide/clusters.md)."""
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
    args, extra = main_parser.parse_known_args(times_attached(sys.argv[1:] if argv is None else argv))
    if extra and getattr(args, "query", "") is None and len(extra) == 1 and not extra[0].startswith("-"):
        args.query = extra[0]  # `sql ROOT --opt X QUERY`: argparse before 3.12 leaves an optional positional after options unfilled
    elif extra:
        main_parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "stream", None) and not args.tap:
        main_parser.error(f"{args.command}: --stream needs --tap (stream names are per tap)")
    if args.debug:
        os.environ["SINGERLAKE_DEBUG"] = "1"
    return run_command(f"singerlake {args.command}", lambda: run(args))


def times_attached(argv: list[str]) -> list[str]:
    """``--start -1d`` as ``--start=-1d``: argparse takes a value starting with "-" for an option."""
    attached: list[str] = []
    for arg in argv:
        if attached and attached[-1] in ("--start", "--end") and BEFORE_NOW.fullmatch(arg.lower()):
            attached[-1] += "=" + arg
        else:
            attached.append(arg)
    return attached


FLAGS = {"template": "--name", "use_spark": "--spark"}  # the API's parameters whose flag is not --<name>


def run(args: argparse.Namespace) -> int:
    """Run the command; an argument the API refuses is named by its flag (``--work-id``, not ``work_id``)."""
    try:
        return args.run(args, output_for(args))
    except BadArgument as exc:
        flag = FLAGS.get(exc.name, "--" + exc.name.replace("_", "-"))
        raise ConfigError(f"{flag}: {exc.problem}") from exc


if __name__ == "__main__":
    sys.exit(main())
