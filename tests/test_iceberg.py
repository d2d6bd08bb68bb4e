"""Iceberg tables (SPEC.md §12): `singerlake project --formats delta,iceberg --iceberg-catalog NAME` registers each
stream's current rows in a pyiceberg catalog, read back by pyiceberg and DuckDB's iceberg extension. The catalogs:
SQL on SQLite, SQL on a real PostgreSQL (the JDBC catalog's table) and AWS Glue (moto's, over HTTP on 127.0.0.1)."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest
from deltalake import DeltaTable
from singerlake.format.layout import LOCK
from singerlake.jobs.vacuum import vacuum
from singerlake.storage import PreconditionFailed
from singerlake.tables import delta
from singerlake.tables import iceberg as iceberg_module
from singerlake.tables.delta import storage_options, table_key
from singerlake.tables.iceberg import DELTA_VERSION, identifier, open_catalog, snapshot_files, sync
from singerlake.tables.project import project
from support.cli_session import CliSession
from support.lake_cli import LakeCli, cli_env, open_lake, run_cli
from support.lakes import TAP, LakeUnderTest, duckdb_for, local_lake_at, s3_lake_at
from support.projections import FIRST, STREAM, by_id, check_exact, land_records, uri
from support.s3_servers import new_bucket, start_moto
from support.storage import Counting

pytest.importorskip("pyiceberg")


@pytest.fixture
def catalog_env(tmp_path, monkeypatch) -> str:
    """A SQL catalog on SQLite named ``lake``, configured through pyiceberg's environment variables."""
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__TYPE", "sql")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__URI", f"sqlite:///{tmp_path}/catalog.db")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__WAREHOUSE", f"file://{tmp_path}/warehouse")
    return "lake"


CATALOGS = ["sqlite", pytest.param("postgres", marks=pytest.mark.heavy), pytest.param("glue", marks=pytest.mark.heavy)]


@pytest.fixture(params=CATALOGS)
def any_catalog(request, tmp_path, monkeypatch) -> str:
    """A catalog named ``lake`` of each kind, configured through pyiceberg's environment variables as a user would."""
    if request.param == "sqlite":
        return request.getfixturevalue("catalog_env")
    if request.param == "postgres":
        server = request.getfixturevalue("postgres")
        monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__TYPE", "sql")
        monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__URI", f"postgresql+psycopg2://postgres@127.0.0.1:{server.port}/postgres")
    else:
        moto = start_moto(tmp_path)  # a Glue of its own: tables of other tests' lakes hold the same names
        request.addfinalizer(moto.stop)
        monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__TYPE", "glue")
        monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__GLUE__ENDPOINT", moto.endpoint)
        monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__GLUE__REGION", "us-east-1")
        monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__GLUE__ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__GLUE__SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__WAREHOUSE", f"file://{tmp_path}/warehouse")
    return "lake"


def catalog_of(lake: LakeUnderTest):
    """The catalog ``lake`` as the CLI opens it (its S3 access the lake's)."""
    return open_catalog("lake", lake.storage)


def duckdb_rows(lake: LakeUnderTest, metadata_location: str) -> list[dict]:
    connection = duckdb_for(lake, "iceberg", needs=("avro",))
    result = connection.sql(f"SELECT * FROM iceberg_scan('{metadata_location}')")
    return [dict(zip(result.columns, row, strict=True)) for row in result.fetchall()]


def delta_rows(lake: LakeUnderTest, stream: str = STREAM) -> list[dict]:
    return DeltaTable(uri(lake, stream), storage_options=storage_options(lake.storage)).to_pyarrow_table().to_pylist()


def project_cli(cli: LakeCli, *extra: str):
    started = time.monotonic()
    done = cli.run("project", *extra)
    print(f"project {' '.join(extra)}: {time.monotonic() - started:.1f}s")
    return done


def check_iceberg_lake(lake: LakeUnderTest) -> None:
    # The three projects through main() in one CliSession (one Spark start), in this test's catalog environment.
    with CliSession(cli_env()) as session:
        check_iceberg_runs(lake, LakeCli(session, lake, "local[2]"))


def check_iceberg_runs(lake: LakeUnderTest, cli: LakeCli) -> None:
    land_records(lake, FIRST)
    done = project_cli(cli, "--formats", "delta,iceberg", "--iceberg-catalog", "lake")
    assert done.returncode == 0, done.stderr
    catalog = catalog_of(lake)
    assert identifier(TAP, STREAM) == (TAP, "public_tricky")
    table = catalog.load_table(identifier(TAP, STREAM))
    assert len(table.snapshots()) == 1 and table.current_snapshot().summary[DELTA_VERSION] == "0"
    rows = table.scan().to_arrow().to_pylist()
    check_exact(by_id(rows))
    assert by_id(rows) == by_id(delta_rows(lake))
    assert str(table.schema().find_field("amount").field_type) == "decimal(38, 18)"
    duck = by_id(duckdb_rows(lake, table.metadata_location))
    check_exact(duck)
    assert duck == by_id(delta_rows(lake))

    land_records(lake, ['{"id": 2, "amount": 2.25, "big": 5, "huge": 4}', '{"id": 4, "amount": 1, "big": 99999999999999999999999}'])
    done = project_cli(cli, "--formats", "delta,iceberg", "--iceberg-catalog", "lake")
    assert done.returncode == 0, done.stderr
    table = catalog.load_table(identifier(TAP, STREAM))
    assert len(table.snapshots()) == 2 and table.current_snapshot().summary[DELTA_VERSION] == "1"
    assert table.current_snapshot().parent_snapshot_id == table.snapshots()[0].snapshot_id
    rows = by_id(table.scan().to_arrow().to_pylist())
    assert sorted(rows) == [1, 2, 3, 4] and rows == by_id(delta_rows(lake))
    assert str(rows[2]["amount"]) == "2.250000000000000000" and rows[2]["big"] == 5 and rows[4]["big"] == 99999999999999999999999
    assert by_id(duckdb_rows(lake, table.metadata_location)) == rows
    delta_files = set(DeltaTable(uri(lake), storage_options=storage_options(lake.storage)).file_uris())
    iceberg_files = {task.file.file_path for task in table.scan().plan_files()}
    assert {path.rsplit("/", 1)[1] for path in iceberg_files} == {path.rsplit("/", 1)[1] for path in delta_files}

    done = project_cli(cli, "--formats", "delta,iceberg", "--iceberg-catalog", "lake")  # nothing new: no snapshot
    assert done.returncode == 0, done.stderr
    assert len(catalog.load_table(identifier(TAP, STREAM)).snapshots()) == 2


def test_project_registers_exact_iceberg_tables_in_each_catalog(local_lake, any_catalog):
    check_iceberg_lake(local_lake)


def test_a_commit_lost_in_the_catalog_is_made_again_on_the_other_writers_table(local_lake, any_catalog, spark, monkeypatch):
    """Another writer, outside the lake's lock, adds a snapshot between this run's load of the table and its commit:
    the catalog refuses this run's commit (its parent is no longer current), and the run makes its snapshot again
    on the table as that writer left it: one snapshot of this run, after the other writer's."""
    import pyarrow as pa

    land_records(local_lake, FIRST)
    project(open_lake(local_lake), spark, TAP, formats=["delta", "iceberg"], iceberg_catalog="lake")
    land_records(local_lake, ['{"id": 9, "amount": 9}'])
    attempts = []
    real = iceberg_module._mirror

    def mirror_after_another_writer(storage, key, table, published, arrow_schema):
        attempts.append(table.metadata_location)
        if len(attempts) == 1:  # the other writer: its own catalog, a snapshot of its own
            other = catalog_of(local_lake).load_table(identifier(TAP, STREAM))
            other.append(pa.table({"id": pa.array([100], pa.int64())}))
        return real(storage, key, table, published, arrow_schema)

    monkeypatch.setattr(iceberg_module, "_mirror", mirror_after_another_writer)
    (result,) = project(open_lake(local_lake), spark, TAP, formats=["delta", "iceberg"], iceberg_catalog="lake")
    table = catalog_of(local_lake).load_table(identifier(TAP, STREAM))
    assert len(attempts) == 2 and attempts[0] != attempts[1], "made again on the table as the other writer left it"
    assert [s.summary.additional_properties.get(DELTA_VERSION) for s in table.snapshots()] == ["0", None, "1"]
    assert result["iceberg"]["snapshot"] == table.current_snapshot().snapshot_id
    assert by_id(table.scan().to_arrow().to_pylist()) == by_id(delta_rows(local_lake)), "the table mirrors Delta's rows again"


def test_project_registers_iceberg_tables_on_seaweedfs(request, seaweedfs_server, catalog_env):
    check_iceberg_lake(s3_lake_at(new_bucket(request, seaweedfs_server)))


def test_a_missing_catalog_is_one_line_with_exit_2(local_lake, catalog_env):
    land_records(local_lake, FIRST)
    for extra, message in (
        (["--formats", "iceberg"], "needs --iceberg-catalog"),
        (["--formats", "delta,iceberg", "--iceberg-catalog", "nowhere"], "'nowhere' is not configured"),
    ):
        done = run_cli(local_lake, "project", *extra)
        assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_type_changes_and_runs_without_iceberg_are_caught_up(local_lake, catalog_env, spark):
    """`--formats iceberg` alone; a column whose type changes gets a new field id; a run without iceberg leaves the
    Iceberg table behind, and the next one with it catches up."""
    struct = {"type": "object", "properties": {"a b": {"type": "number"}, "c": {"type": "array", "items": {"type": "string"}}}}
    schema = {"type": "object", "properties": {"id": {"type": "integer"}, "v": {"type": "number"}, "o": struct}}
    stream, o = "users", {"a b": Decimal("0.5"), "c": ["x", None]}
    run = lambda formats: project(open_lake(local_lake), spark, TAP, formats=formats, iceberg_catalog="lake")  # noqa: E731
    land_records(local_lake, ['{"id": 1, "v": 1.5, "o": {"a b": 0.5, "c": ["x", null]}}'], stream, schema)
    run(["iceberg"])
    table = catalog_of(local_lake).load_table(identifier(TAP, stream))
    first = table.current_snapshot().snapshot_id
    assert table.scan().to_arrow().to_pylist() == [{"id": 1, "v": Decimal("1.5"), "o": o}]
    assert str(table.schema().find_field("o").field_type).startswith("struct<")

    land_records(local_lake, ['{"id": 2, "v": 1e400}'], stream, schema)
    run(["delta"])  # Iceberg not asked for: left at the first version
    assert len(catalog_of(local_lake).load_table(identifier(TAP, stream)).snapshots()) == 1
    run(["delta", "iceberg"])  # nothing new for Delta; Iceberg catches up in one snapshot
    table = catalog_of(local_lake).load_table(identifier(TAP, stream))
    assert len(table.snapshots()) == 2 and table.current_snapshot().summary[DELTA_VERSION] == "1"
    assert by_id(table.scan().to_arrow().to_pylist()) == {1: {"id": 1, "v": "1.5", "o": o}, 2: {"id": 2, "v": "1E+400", "o": None}}
    # The older snapshot stays readable; its files hold no field ids and are read through the current name mapping,
    # so the column whose type changed (a new field id) reads as null there (SPEC.md §12).
    assert table.scan(snapshot_id=first).to_arrow().to_pylist() == [{"id": 1, "v": None, "o": o}]
    assert by_id(duckdb_rows(local_lake, table.metadata_location)) == by_id(delta_rows(local_lake, stream))

    deletions = vacuum(open_lake(local_lake), retention_s=0, force=True)  # a dry run: Delta's vacuum leaves Iceberg's metadata alone
    assert not [d.path for d in deletions if "/_iceberg/" in d.path]


def test_concurrent_commits_to_one_table_are_serialised_and_many_streams_share_the_catalog(local_lake, any_catalog, spark, monkeypatch):
    """Two syncs of one table at once (two runs): the lake's lock lets one create the table and commit, the other then
    finds that version mirrored. Several streams commit to one SQLite catalog in one run (the driver's threads)."""
    schema = {"type": "object", "properties": {"id": {"type": "integer"}, "s": {"type": "string"}}}
    streams = [f"s{number}" for number in range(6)]
    for stream in streams:
        land_records(local_lake, [f'{{"id": 1, "s": "{stream}"}}'], stream, schema)
    project(open_lake(local_lake), spark, TAP, formats=["delta"])
    storage, published = local_lake.storage, delta.latest(local_lake.storage, table_key(TAP, "s0"))
    arrow_schema = DeltaTable(uri(local_lake, "s0")).to_pyarrow_table().schema
    catalogs = [open_catalog("lake", storage) for _ in range(2)]
    with monkeypatch.context() as patch, ThreadPoolExecutor(2) as pool:
        overlap = Overlap(patch, catalogs)
        runs = [pool.submit(sync, overlap.storage(storage, n), catalogs[n], TAP, "s0", published, arrow_schema) for n in range(2)]
        snapshots = [run.result()["snapshot"] for run in runs]  # sync names the table: namespace, table, metadata, snapshot
    table = catalogs[0].load_table(identifier(TAP, "s0"))
    assert len(table.snapshots()) == 1 and snapshots == [table.current_snapshot().snapshot_id] * 2, (table.snapshots(), snapshots)
    # They overlapped: the second to read the table's metadata was refused the table's lock before, while the first held it.
    reads = [run for event, run in overlap.events if event == "read"]
    assert sorted(reads) == [0, 1] and ("refused", reads[1]) in overlap.events, overlap.events
    assert overlap.events.index(("refused", reads[1])) < overlap.events.index(("read", reads[1])), overlap.events

    results = project(open_lake(local_lake), spark, TAP, formats=["delta", "iceberg"], iceberg_catalog="lake")
    assert sorted(result["stream"] for result in results) == streams
    for stream in streams:
        assert catalogs[0].load_table(identifier(TAP, stream)).scan().to_arrow().to_pylist() == [{"id": 1, "s": stream}]


class Overlap:
    """Two syncs of one table, run ``n`` with ``catalogs[n]`` and ``storage(n)``, forced to overlap: the first to read the
    table's metadata (inside the table's lock) waits there until the other has been refused that lock, or, were nothing
    serialising them, has read the metadata too. ``events``: ("read", n) and ("refused", n), in order."""

    def __init__(self, monkeypatch, catalogs: list, hold_s: float = 60):
        self.catalogs, self.hold_s = catalogs, hold_s
        self.events: list[tuple[str, int]] = []
        self.changed = threading.Condition()
        real = iceberg_module._load_or_create
        monkeypatch.setattr(iceberg_module, "_load_or_create", lambda catalog, *args: self._read(catalog, real(catalog, *args)))

    def storage(self, inner, run: int) -> Counting:
        return _Refusals(inner, self, run)

    def note(self, event: str, run: int) -> None:
        with self.changed:
            self.events.append((event, run))
            self.changed.notify_all()

    def _read(self, catalog, table):
        run = self.catalogs.index(catalog)
        self.note("read", run)
        with self.changed:
            if [event for event, _ in self.events].count("read") == 1:  # the first: held until the other was refused or read
                other = lambda: any(n != run for _, n in self.events)  # noqa: E731
                assert self.changed.wait_for(other, self.hold_s), f"the other sync never tried the table: {self.events}"
        return table


class _Refusals(Counting):
    """The lake's storage of one sync: notes when that sync is refused the table's lock (a create-only write that lost)."""

    def __init__(self, inner, overlap: Overlap, run: int):
        super().__init__(inner)
        self.overlap, self.run = overlap, run

    def write(self, key: str, data: bytes, **options) -> str:
        try:
            return super().write(key, data, **options)
        except PreconditionFailed:
            if key.endswith(LOCK):
                self.overlap.note("refused", self.run)
            raise


def test_a_large_streams_snapshot_replaces_only_the_touched_buckets_files(local_lake, catalog_env, spark):
    """Incremental like Delta: the run's Iceberg snapshot deletes and adds exactly the files its Delta commit does."""
    stream = "public.big"
    schema = {"type": "object", "properties": {"id": {"type": "integer"}, "v": {"type": "string"}}}
    land_records(local_lake, [json.dumps({"id": i, "v": f"first {i}" * 3}) for i in range(3000)], stream, schema)
    threshold = sum(entry["size"] for entry in local_lake.manifest(stream)["files"]) // 2
    options = {"formats": ["delta", "iceberg"], "iceberg_catalog": "lake", "small_stream_bytes": threshold}
    run = lambda: project(open_lake(local_lake), spark, TAP, **options)  # noqa: E731
    run()
    land_records(local_lake, [json.dumps({"id": i, "v": "second"}) for i in (7, 2024)], stream, schema)
    run()
    table = catalog_of(local_lake).load_table(identifier(TAP, stream))
    log = local_lake.read(f"{table_key(TAP, stream)}/_delta_log/{1:020d}.json").decode()
    actions = [json.loads(line) for line in log.splitlines() if line.strip()]
    summary = table.current_snapshot().summary
    assert int(summary["deleted-data-files"]) == len([a for a in actions if "remove" in a]) <= 2
    assert int(summary["added-data-files"]) == len([a for a in actions if "add" in a]) <= 2
    assert int(summary["total-data-files"]) >= 8 and summary.operation.value == "overwrite"
    rows = by_id(table.scan().to_arrow().to_pylist())
    assert len(rows) == 3000 and rows[7]["v"] == rows[2024]["v"] == "second" and rows[8]["v"] == "first 8" * 3


def test_two_streams_mapping_to_one_table_name_fail_the_second(local_lake, catalog_env, spark):
    schema = {"type": "object", "properties": {"id": {"type": "integer"}}}
    land_records(local_lake, ['{"id": 1}'], "public.users", schema)
    land_records(local_lake, ['{"id": 2}'], "public_users", schema)
    failures = []
    project(open_lake(local_lake), spark, TAP, formats=["delta", "iceberg"], iceberg_catalog="lake", failures=failures)
    assert len(failures) == 1 and "holds stream" in failures[0].cause, failures
    table = catalog_of(local_lake).load_table((TAP, "public_users"))
    assert table.properties["singerlake.stream"] != failures[0].stream and len(table.scan().to_arrow()) == 1


def test_the_same_stream_of_another_lake_fails_rather_than_take_the_table_over(local_lake, catalog_env, spark, tmp_path):
    """Two lakes share one catalog and hold the same tap and stream: the second lake's run fails that stream,
    naming both locations, and the first lake's table keeps its rows."""
    (tmp_path / "other").mkdir()
    other = local_lake_at(tmp_path / "other")
    land_records(local_lake, ['{"id": 1}'], "users", {"type": "object", "properties": {"id": {"type": "integer"}}})
    land_records(other, ['{"id": 2}'], "users", {"type": "object", "properties": {"id": {"type": "integer"}}})
    project(open_lake(local_lake), spark, TAP, formats=["delta", "iceberg"], iceberg_catalog="lake")
    failures = []
    project(open_lake(other), spark, TAP, formats=["delta", "iceberg"], iceberg_catalog="lake", failures=failures)
    assert [failure.stream for failure in failures] == ["users"] and "is another lake's" in failures[0].cause, failures
    assert str(tmp_path / "other") in failures[0].cause
    assert catalog_of(local_lake).load_table((TAP, "users")).scan().to_arrow().to_pylist() == [{"id": 1}]


def test_vacuum_keeps_every_file_a_retained_snapshot_lists_and_expires_the_older_ones(local_lake, catalog_env, spark):
    """project, update, project, update, project; then vacuum with a retention of 0: every snapshot still in the
    catalog reads in full with pyiceberg, without the catalog (nothing expires, every listed file stays) and with
    it (snapshots older than the retention expire first, then their files go)."""
    runs = [FIRST, ['{"id": 2, "amount": 2.25, "big": 5, "huge": 4}'], ['{"id": 3, "amount": 7, "big": 6, "huge": 5}']]
    for records in runs:
        land_records(local_lake, records)
        project(open_lake(local_lake), spark, TAP, formats=["delta", "iceberg"], iceberg_catalog="lake")
    table = catalog_of(local_lake).load_table(identifier(TAP, STREAM))
    snapshots = table.snapshots()
    assert len(snapshots) == 3
    rows = {s.snapshot_id: by_id(table.scan(snapshot_id=s.snapshot_id).to_arrow().to_pylist()) for s in snapshots}
    replaced = set(DeltaTable(uri(local_lake), version=0).file_uris()) - set(DeltaTable(uri(local_lake)).file_uris())
    assert replaced, "the updates replaced files the first snapshot lists"

    def reads_in_full() -> list[int]:
        current = catalog_of(local_lake).load_table(identifier(TAP, STREAM))
        for snapshot in current.snapshots():  # a missing data file fails the scan
            assert by_id(current.scan(snapshot_id=snapshot.snapshot_id).to_arrow().to_pylist()) == rows[snapshot.snapshot_id]
        return [s.snapshot_id for s in current.snapshots()]

    deleted = vacuum(open_lake(local_lake), retention_s=0, apply=True, force=True)  # no catalog: nothing can expire
    assert deleted and not {d.path.rsplit("/", 1)[1] for d in deleted} & {p.rsplit("/", 1)[1] for p in replaced}
    assert reads_in_full() == [s.snapshot_id for s in snapshots]

    second = snapshots[1].timestamp_ms  # as if run when the second snapshot was made: only the first is older
    deleted = vacuum(open_lake(local_lake), retention_s=0, apply=True, force=True, now=second, iceberg_catalog="lake")
    assert reads_in_full() == [s.snapshot_id for s in snapshots[1:]]
    only_first = {p.rsplit("/", 1)[1] for p in replaced} - {f.rsplit("/", 1)[1] for s in snapshots[1:] for f in snapshot_files(table, [s])}
    assert only_first and only_first <= {d.path.rsplit("/", 1)[1] for d in deleted}, "the first snapshot's own files went"

    vacuum(open_lake(local_lake), retention_s=0, apply=True, force=True, iceberg_catalog="lake")
    assert reads_in_full() == [snapshots[-1].snapshot_id]
    assert by_id(DeltaTable(uri(local_lake)).to_pyarrow_table().to_pylist()) == rows[snapshots[-1].snapshot_id]
