"""``singerlake project``: raw -> ``staging/`` parts -> each stream's Delta table in ``published/`` (SPEC.md §12).

Per stream, a run reads only the records committed after the position the table's latest commit
records, keeps the current row per key (latest by commit, then record time, then position) and
changes only what must change:

    staging/<tap>/<stream>/part-<id>.parquet     current rows: _key, positions, _record (the record's JSON text)
    published/<tap>/<stream>/part-<id>.parquet   the same rows typed exactly (``exact``), one file per staging part
    published/<tap>/<stream>/_delta_log/         one Delta commit per run (``delta``), the only commit point
    published/<tap>/<stream>/_iceberg/           with ``iceberg``: the same files as an Iceberg table, one snapshot per run (``iceberg``)

A previous part holding a key a new record updates is rewritten without that row; the new current
rows form one new part; other parts stay. Column types come from the declared schema and the
values held (each part stores what its values need); when they change, every published file is
rewritten in that run's commit.

Small streams (new stored bytes plus previous parts up to ``SMALL_STREAM_BYTES``) are projected
in ONE Spark job, one work item per stream, with pyarrow on the executor; their new rows form parts
of at most ``PART_ROWS`` rows. New records are read in bulk: envelopes in one decoder call, records
by Arrow's JSON reader, typed as they are read under the types their files' column statistics give
(``format/columnar``; record by record with ``exact`` where Arrow cannot read a value exactly). Larger streams run a
Spark job each, incrementally too: their parts are **buckets** of keys (``crc32(_key) mod
buckets``), so only the buckets the new records touch are rewritten, each by one executor (its
previous part and its new rows). Both give the same rows and types.

Deletes (Singer's): a current record with ``_sdc_deleted_at``, and rows of older table versions placed
before an ACTIVATE_VERSION, stay with ``_sdc_deleted_at`` set (soft, the default) or are left out
(``hard_delete``); activations the table has not applied yet reach every previous part.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from singerlake.changes import options_digest, read_changes
from singerlake.commits.errors import CommitRejected
from singerlake.errors import ConfigError
from singerlake.format.catalogue import replay_schema
from singerlake.lake import Lake
from singerlake.pause import pause_point
from singerlake.spark.runner import (
    Failures,
    Progress,
    StreamFailure,
    for_each_stream,
    selected_streams,
)
from singerlake.spark.session import session_of
from singerlake.tables import delta, iceberg, overrides, partitions
from singerlake.tables.buckets import large_layout, project_large_stream
from singerlake.tables.deletes import SDC_DELETED_AT
from singerlake.tables.heads import raise_heads, read_heads
from singerlake.tables.partitioned import project_partitioned_stream, starts_table
from singerlake.tables.plan import StreamPlan, Wanted, plan_stream, published_schema
from singerlake.tables.small import PART_ROWS, project_small_streams

log = logging.getLogger("singerlake.project")

SMALL_STREAM_BYTES = 64 << 20  # stored (gzipped) bytes; decoded rows take several times that in memory


FORMATS = ("delta", "csv", "iceberg")


# -- the job ---------------------------------------------------------------------------------------
def commit_run(lake: Lake, plan: StreamPlan, result: dict) -> dict:
    """The run's one Delta commit: the last step, so a crash or a failed stream leaves the previous version current."""
    state = {"position": plan.end.to_bookmark(), "types": result["types"], "schema": result["schema"], "parts": result["parts"]}
    state |= {"deletes": plan.deletes, "activations": plan.activated}
    if plan.overrides:
        state["overrides"] = plan.overrides
    if "buckets" in result:  # a large stream's parts are buckets of keys (SPEC.md §12)
        state["buckets"] = result["buckets"]
    if plan.partitioning:
        state["partitioning"] = plan.partitioning
    adds = [{"path": part["published"], "size": part["size"], "rows": part["rows"]} | partition_of(part) for part in result["adds"]]
    schema = published_schema(plan.properties, result["types"], plan.overrides, plan.partitioning)
    pause_point("project-before-commit")
    partition_by, removes = partitions.columns(plan.partitioning), result["removes"]
    version = delta.commit(lake.storage, plan.table, plan.published, schema, adds, removes, result["overwrite"], state, partition_by)
    plan.published = delta.Published(version, state, state_version=version)
    return plan.summary(plan.new_records)


def partition_of(part: dict) -> dict:
    return {"partition": part["partition"]} if "partition" in part else {}


def check_formats(lake: Lake, formats: list[str], iceberg_catalog: str | None = None):
    """ConfigError for an unknown format or Iceberg without a catalog that opens; the Iceberg catalog (or None)."""
    unknown = set(formats) - set(FORMATS) - {"parquet"}
    if unknown:
        raise ConfigError(f"unknown published formats {sorted(unknown)}; use delta, csv and/or iceberg")
    if "iceberg" not in formats:
        return None
    if not iceberg_catalog:
        raise ConfigError("--formats iceberg needs --iceberg-catalog NAME (a pyiceberg catalog)")
    return iceberg.open_catalog(iceberg_catalog, lake.storage)


def sync_iceberg(lake: Lake, catalog, plan: StreamPlan) -> dict | None:
    """The stream's Iceberg table made the Delta table's latest version, in one snapshot (SPEC.md §12)."""
    schema = published_schema(plan.properties, plan.state["types"], plan.state.get("overrides"), plan.state.get("partitioning"))
    return iceberg.sync(lake.storage, catalog, plan.tap_id, plan.stream, plan.published, schema)


def named_properties(lake: Lake, selected: list[tuple[str, str]], named: list[str], separator: str) -> dict[str, dict]:
    """The properties of each selected stream (name -> properties), read only for the streams a choice may
    name (``named``: the texts, a stream's name then ``separator``); the others have none."""
    streams: dict[str, dict] = {}
    for tap, name in selected:
        if any(text == name or text.startswith(f"{name}{separator}") for text in named):
            properties = replay_schema(lake.manifest(tap, name)).get("properties", {})
            streams[name] = {**streams.get(name, {}), **properties, SDC_DELETED_AT: {}}
    for _, name in selected:
        streams.setdefault(name, {SDC_DELETED_AT: {}})
    return streams


def selected_names(lake: Lake, tap_id: str, stream: str | None) -> list[str]:
    """The tap's streams (from its catalogue), or the one named."""
    return [name for _, name in selected_streams(lake, tap_id, stream)]


def chosen_types(lake: Lake, selected: list[tuple[str, str]], types: dict | list[str] | None) -> overrides.Chosen:
    """The column types the user chose, checked against the selected streams' properties (ConfigError:
    exit 2, before any work). Only the streams a choice may name are read."""
    if not types:
        return {}
    texts = [types] if isinstance(types, str) else types
    named = texts.keys() if isinstance(texts, dict) else [text.strip("`").split("`")[0] for text in texts]
    return overrides.resolve(texts, named_properties(lake, selected, list(named), "."))


def chosen_partitions(lake: Lake, selected: list[tuple[str, str]], partition_by: dict | list[str] | None) -> dict[str, list[dict]]:
    """Each stream's partitioning as the user chose it, checked against its properties (ConfigError: exit 2, before any work)."""
    if not partition_by:
        return {}
    texts = [partition_by] if isinstance(partition_by, str) else partition_by
    named = list(texts.keys()) if isinstance(texts, dict) else list(texts)
    return partitions.resolve(texts, named_properties(lake, selected, named, "" if isinstance(texts, dict) else "="))


def project(
    lake: Lake,
    spark,
    tap_id: str | None = None,
    stream: str | None = None,
    formats: list[str] | None = None,
    small_stream_bytes: int = SMALL_STREAM_BYTES,
    part_rows: int = PART_ROWS,
    progress: Progress | None = None,
    failures: list[StreamFailure] | None = None,
    hard_delete: bool = False,
    iceberg_catalog: str | None = None,
    types: dict | list[str] | None = None,
    partition_by: dict | list[str] | None = None,
    rebuild: bool = False,
) -> list[dict]:
    """Project the selected streams. A stream that fails is added to ``failures`` (its table stays at
    its last version) and the others are projected; without ``failures``, StreamsFailed is raised at the end.
    Deleted rows (``_sdc_deleted_at``, ACTIVATE_VERSION) stay with ``_sdc_deleted_at`` set, or with
    ``hard_delete`` are left out (SPEC.md §12). With ``iceberg`` among the formats, each table is also
    an Iceberg table in the pyiceberg catalog ``iceberg_catalog``. ``spark`` may be an ``OnDemand``
    session: small streams that fit one task then run in this process on a local master, and Spark
    starts only for more. ``types`` chooses column types (``{stream: {column: type}}`` or
    ``--type`` texts ``STREAM.COLUMN=TYPE``; SPEC.md §12): a value that does not fit fails its stream.
    ``partition_by`` partitions tables by record fields (``{stream: ["created_at:day"]}`` or ``--partition-by``
    texts ``STREAM=FIELD[:TRANSFORM],...``); a table partitioned otherwise fails its stream unless ``rebuild``."""
    lake.check_exists()
    formats = ["delta" if fmt == "parquet" else fmt for fmt in (formats or ["delta"])]
    catalog = check_formats(lake, formats, iceberg_catalog)
    found = Failures()
    taps = [tap_id] if tap_id else lake.taps()
    heads = {tap: read_heads(lake.storage, tap) for tap in taps}
    readings = {}  # per tap, what its change log says to visit (SPEC.md §16); a named stream or a rebuild visits all
    if stream is None and not rebuild:
        asked = options_digest([formats, hard_delete, types, partition_by, iceberg_catalog])
        readings = {tap: read_changes(lake.storage, tap, heads[tap].changes, asked) for tap in taps}
    named = {tap: r.streams for tap, r in readings.items() if r.streams is not None and not (types or partition_by)}
    # streams the log names are visited as named (the catalogue may not list them yet); the catalogue, with
    # every stream's schema, is read only to visit every stream or to check the streams options name
    selected = [(tap, name) for tap in taps for name in (sorted(named[tap]) if tap in named else selected_names(lake, tap, stream))]
    partitioned = chosen_partitions(lake, selected, partition_by)
    wanted = Wanted(hard_delete, "csv" in formats, chosen_types(lake, selected, types), partitioned, rebuild)
    selected = [
        (tap, name) for tap, name in selected if tap not in readings or readings[tap].streams is None or name in readings[tap].streams
    ]

    def run(streams: list[tuple[str, str]], hinted: bool) -> tuple[dict, dict, list]:
        """Plan, write and commit ``streams``: (plans, summaries of the committed, the streams planned from
        a stale head, whose commit found the next version taken)."""
        nonlocal spark

        def plan(tap: str, name: str) -> StreamPlan:
            head = heads[tap].get(name) if hinted else None
            return plan_stream(lake, tap, name, wanted, head)

        plans = for_each_stream(streams, plan, found)
        pending = [plan for plan in plans.values() if not plan.up_to_date]

        def is_large(plan: StreamPlan) -> bool:
            """Bucketed: stays large; partitioned: large only when the run starts its table (SPEC.md §12, a known limit)."""
            return (plan.bytes > small_stream_bytes and (not plan.partitioning or starts_table(plan))) or "buckets" in plan.state

        small = [plan for plan in pending if not is_large(plan)]
        written = project_small_streams(lake, spark, small, formats, found, progress, part_rows)
        large = {(plan.tap_id, plan.stream): (plan, large_layout(plan, small_stream_bytes)) for plan in pending if is_large(plan)}
        if any(not layout.one_task or plan.partitioning for plan, layout in large.values()):
            spark = session_of(spark)  # started here: a failed start is the run's error, not a stream's

        def run_large(tap: str, name: str) -> dict:
            plan, layout = large[(tap, name)]
            if plan.partitioning:
                return project_partitioned_stream(lake, spark, plan, layout, formats, part_rows)
            return project_large_stream(lake, spark, plan, layout, formats)

        written |= for_each_stream(list(large), run_large, found, 1)
        stale: list[tuple[str, str]] = []

        def commit(tap: str, name: str) -> dict | None:
            plan = plans[(tap, name)]
            try:
                return commit_run(lake, plan, written[(tap, name)])
            except CommitRejected:
                if plan.published.checkpoint_read:
                    raise  # planned from the log itself: another run committed meanwhile, the stream fails
                stale.append((tap, name))
                return None

        committed = for_each_stream(list(written), commit, found)
        return plans, {stream_id: result for stream_id, result in committed.items() if result is not None}, stale

    plans, committed, stale = run(selected, hinted=True)
    if stale:  # planned from a stale head (a vacuum's fence, a concurrent run): once more, from the log
        log.info("%d stream(s) planned from a stale head are planned again from the Delta log", len(stale))
        again, committed_again, _ = run(stale, hinted=False)
        plans |= again
        committed |= committed_again
    snapshots: dict = {}
    if catalog is not None:  # after the Delta commits; also streams with nothing new whose Iceberg table lags behind
        mirror = [stream_id for stream_id, plan in plans.items() if not found.has(*stream_id) and plan.published.version is not None]
        for tap in sorted({tap for tap, _ in mirror}):  # once, before the streams' threads
            iceberg.ensure_namespace(catalog, tap)
        snapshots = for_each_stream(mirror, lambda tap, name: sync_iceberg(lake, catalog, plans[(tap, name)]), found)
    for tap in heads:  # what the run committed, and the heads of tables it had to read from their logs
        versions = {name: plan.published.version for (t, name), plan in plans.items() if t == tap and plan.published.version is not None}
        place = None
        if tap in readings:  # streams that failed (Iceberg's sync too) are visited again next run
            place = replace(readings[tap].place, pending=sorted(name for t, name in selected if t == tap and found.has(t, name)))
        raise_heads(lake.storage, tap, versions, heads[tap], place)  # writes only when a head rises or the place moves
    results = []
    for stream_id, plan in plans.items():
        if not found.has(*stream_id):
            result = committed.get(stream_id) or plan.summary()
            results.append(result | ({"iceberg": snapshots[stream_id]} if snapshots.get(stream_id) else {}))
    found.deliver(failures)
    return results
