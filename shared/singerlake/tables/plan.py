"""Planning a stream's projection run on the driver: what it reads, what it holds, and the shape of its result."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dataclass_field

from singerlake.format.catalogue import replay_schema
from singerlake.format.errors import ProjectionError
from singerlake.format.manifest import Manifest
from singerlake.format.names import encode_segment
from singerlake.format.needs import StatsReader
from singerlake.format.positions import Position, check_bookmark
from singerlake.lake import Lake
from singerlake.replay.plan import plan_files
from singerlake.tables import delta, delta_log, partitions
from singerlake.tables.deletes import deletes_properties
from singerlake.tables.schemas import published_schema, schema_text  # noqa: F401 (the project modules take them from here)


# -- planning on the driver ----------------------------------------------------------------------
@dataclass
class StreamPlan:
    tap_id: str
    stream: str
    manifest: Manifest
    published: delta.Published
    end: Position  # the stream's end: what this run's commit records
    up_to_date: bool = False
    files: list[dict] = dataclass_field(default_factory=list)  # data files holding new records (datasource.plan_files)
    previous_bytes: int = 0  # bytes of the previous staging parts
    hard: bool = False  # hard deletes (SPEC.md §12); soft by default
    anew: bool = False  # the table's delete mode differs (or it has none): project the stream anew
    activations: list[dict] = dataclass_field(default_factory=list)  # the ACTIVATE_VERSIONs the table has not applied yet
    activated: int = 0  # the stream's ACTIVATE_VERSIONs: how many the table has applied after this run
    needs: dict | None = None  # what the new records need, from their files' statistics (None: a file has none)
    overrides: dict = dataclass_field(default_factory=dict)  # column -> the type the user chose (SPEC.md §12)
    partitioning: list[dict] = dataclass_field(default_factory=list)  # the run's partition fields (SPEC.md §12, partitions.py)

    @property
    def table(self) -> str:
        return delta.table_key(self.tap_id, self.stream)

    @property
    def staging(self) -> str:
        return f"staging/{encode_segment(self.tap_id)}/{encode_segment(self.stream)}"

    @property
    def state(self) -> dict:
        return (not self.anew and self.published.state) or {"parts": [], "types": {}, "schema": None}

    @property
    def deletes(self) -> str:
        return "hard" if self.hard else "soft"

    @property
    def new_records(self) -> int:
        return sum(f["entry"]["records"] - f["skip"] for f in self.files)

    @property
    def bytes(self) -> int:
        return sum(f["entry"]["size"] for f in self.files) + self.previous_bytes

    @property
    def keys(self) -> list[str]:
        return self.manifest.versions[self.manifest.latest_hash()]["key_properties"]

    @property
    def properties(self) -> dict:
        return deletes_properties(replay_schema(self.manifest).get("properties", {}), self.hard, self.activated > 0)

    def summary(self, new_records: int = 0) -> dict:
        parts = self.state["parts"]
        return {
            "tap_id": self.tap_id,
            "stream": self.stream,
            "table": self.table,
            "version": self.published.version,
            "rows": sum(part["rows"] for part in parts),
            "new_records": new_records,
            "csv": [part["csv"] for part in parts if "csv" in part],
        }


def missing_twins(parts: list[dict], csv: bool) -> bool:
    """Whether a run asked for CSV finds current parts without their twin (an earlier run without it):
    a format newly asked for is written for the whole table, whatever changed (SPEC.md §12)."""
    return csv and any("csv" not in part for part in parts)


@dataclass
class Wanted:
    """What the run is asked for, the same for every stream but the per-stream choices."""

    hard: bool = False  # hard deletes (SPEC.md §12); soft by default
    csv: bool = False
    types: dict = dataclass_field(default_factory=dict)  # stream -> column -> chosen type
    partition_by: dict = dataclass_field(default_factory=dict)  # stream -> partitioning
    rebuild: bool = False  # project anew a stream whose partitioning changes


def plan_stream(lake: Lake, tap_id: str, stream: str, wanted: Wanted | None = None, head: int | None = None) -> StreamPlan:
    """What a run must do for the stream. ``head``: the table's version as the heads name it (SPEC.md §12)."""
    wanted = wanted or Wanted()
    manifest = lake.manifest(tap_id, stream)
    published = delta.latest(lake.storage, delta.table_key(tap_id, stream), head)
    end = Position(*manifest.end_position(), manifest.generation)
    activations = manifest.activate_versions
    overrides, partitioning = wanted.types.get(stream, {}), wanted.partition_by.get(stream, [])
    plan = StreamPlan(tap_id, stream, manifest, published, end, hard=wanted.hard, activated=len(activations), overrides=overrides)
    plan.partitioning = partitioning
    plan.anew = published.state is not None and published.state.get("deletes") != plan.deletes
    if published.state is not None and published.state.get("partitioning", []) != partitioning:
        if not wanted.rebuild:
            was, asked = partitions.spec_text(published.state.get("partitioning")), partitions.spec_text(partitioning)
            raise ProjectionError(f"its table is partitioned by {was}, this run asks for {asked}: give --rebuild to project it anew")
        plan.anew = True
    after = Position.from_bookmark(plan.state["position"], stream) if "position" in plan.state else None
    check_bookmark(after, manifest)
    plan.activations = activations[plan.state.get("activations", 0) :]
    caught_up = after is not None and after >= end and not plan.activations
    same_types = plan.state.get("overrides", {}) == plan.overrides  # a choice given or dropped retypes the table
    if (caught_up and same_types and not missing_twins(plan.state["parts"], wanted.csv)) or not manifest.versions:
        if not published.checkpoint_read and delta_log.committed(lake.storage, plan.table, published.version + 1):
            return plan_stream(lake, tap_id, stream, wanted)  # a stale head: the log tells what is new
        plan.up_to_date = True
        return plan
    plan.files = plan_files(manifest, set(manifest.versions), after, manifest.commits)
    known, unread = StatsReader(manifest.versions, plan.properties).split(plan.files)
    plan.needs = None if unread else known
    parts = plan.state["parts"]
    if all("bytes" in part for part in parts):
        plan.previous_bytes = sum(part["bytes"] for part in parts)
    else:  # parts of a table written before parts recorded their size
        sizes = {info.key: info.size for info in lake.storage.list(f"{plan.staging}/")}
        plan.previous_bytes = sum(sizes.get(part["staging"], 0) for part in parts)
    return plan


def work_item(plan: StreamPlan, formats: list[str]) -> dict:
    return {
        "tap_id": plan.tap_id,
        "stream": plan.stream,
        "properties": plan.properties,
        "keys": plan.keys,
        "files": plan.files,
        "parts": plan.state["parts"],
        "schema": plan.state["schema"],
        "types": plan.state["types"],
        "staging": plan.staging,
        "table": plan.table,
        "csv": "csv" in formats,
        "hard": plan.hard,
        "activations": plan.activations,
        "needs": plan.needs,
        "overrides": plan.overrides,
        "partitioning": plan.partitioning,
        "kinds": partitions.field_kinds(plan.partitioning, plan.properties),
    }


def run_result(kept: list[dict], added: list[dict], replaced: list[dict], overwrite: bool, types: dict, schema: str, **extra) -> dict:
    """A stream's run, for ``commit_run``: its parts now, and what its Delta commit adds and removes
    (every part when the column types changed and all were published again)."""
    return {
        "parts": kept + added,
        "adds": kept + added if overwrite else added,
        "removes": [{"path": part["published"], "size": part["size"], "partition": part.get("partition", {})} for part in replaced],
        "overwrite": overwrite,
        "types": types,
        "schema": schema,
        **extra,
    }
