"""Singer deletes in the projection (SPEC.md §12): a full-table refresh's ACTIVATE_VERSION and log-based
`_sdc_deleted_at`, soft by default (`_sdc_deleted_at` set) or hard (rows left out), on both paths."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone

import pytest
from deltalake import DeltaTable
from singerlake.format.exact import json_text
from singerlake.tables import delta
from singerlake.tables.blocks import bucket_of
from singerlake.tables.delta import table_key, table_uri
from singerlake.tables.project import project
from support.lake_cli import open_lake, run_cli
from support.lakes import TAP, LakeUnderTest, joined, land, schema_msg

STREAM = "public.users"
SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": ["string", "null"]}}}
LARGE = 1  # small_stream_bytes: every stream takes the large (bucketed) path
SMALL = 64 << 20


def record(row: dict, version: int | None = None) -> bytes:
    """A RECORD message; a full-table sync's carries its table version in the envelope (Singer SDK)."""
    message = {"type": "RECORD", "stream": STREAM, "record": row, **({"version": version} if version is not None else {})}
    return json.dumps(message).encode()


def activate(version: int) -> bytes:
    return json.dumps({"type": "ACTIVATE_VERSION", "stream": STREAM, "version": version}).encode()


def send(lake: LakeUnderTest, *messages: bytes, schema: dict = SCHEMA) -> None:
    land(lake.config, joined([schema_msg(STREAM, schema, ["id"]), *messages]))


def run(lake: LakeUnderTest, spark, hard: bool, small_stream_bytes: int, stream: str | None = None) -> dict:
    """Project the tap (or only ``stream``, which is then planned even with nothing new): the stream's result."""
    (result,) = project(open_lake(lake), spark, TAP, stream, hard_delete=hard, small_stream_bytes=small_stream_bytes)
    return result


def table(lake: LakeUnderTest, stream: str = STREAM) -> DeltaTable:
    return DeltaTable(table_uri(lake.storage, table_key(TAP, stream)))


def rows(lake: LakeUnderTest) -> dict[int, dict]:
    found = table(lake).to_pyarrow_table().to_pylist()
    assert len(found) == len({row["id"] for row in found}), "one row per key"
    return {row["id"]: row for row in found}


def deleted_at(lake: LakeUnderTest) -> dict[int, datetime | None]:
    return {key: row["_sdc_deleted_at"] for key, row in rows(lake).items()}


def received(lake: LakeUnderTest, version: int) -> datetime:
    (activation,) = [a for a in lake.manifest(STREAM)["activate_versions"] if a["version"] == version]
    return datetime.fromisoformat(activation["received"].replace("Z", "+00:00"))


def utc(value: datetime | None) -> datetime | None:
    return value and value.astimezone(timezone.utc)


def padding(i: int) -> str:
    """About 1 KiB that gzip cannot shrink (an undeclared property): room for several buckets on the large path."""
    return "".join(hashlib.sha256(f"{i} {n}".encode()).hexdigest() for n in range(32))


def full_table_refresh(lake: LakeUnderTest, spark, hard: bool, small_stream_bytes: int) -> None:
    """Version 1 sends keys 1..5, version 2 only keys 1..3: after version 2's ACTIVATE_VERSION, 4 and 5 are gone at the source."""
    send(lake, *(record({"id": i, "name": f"v1 {i}", "pad": padding(i)}, 1) for i in range(1, 6)), activate(1))
    run(lake, spark, hard, small_stream_bytes)
    assert {key: row["name"] for key, row in rows(lake).items()} == {i: f"v1 {i}" for i in range(1, 6)}
    if not hard:  # the stream has an activation: the column is there, and nothing is deleted yet
        assert set(deleted_at(lake).values()) == {None}
    send(lake, *(record({"id": i, "name": f"v2 {i}"}, 2) for i in range(1, 4)), activate(2))
    assert run(lake, spark, hard, small_stream_bytes)["version"] == 1


@pytest.mark.parametrize("small_stream_bytes", [SMALL, LARGE], ids=["small", "large"])
@pytest.mark.parametrize("hard", [False, True], ids=["soft", "hard"])
def test_a_full_table_refresh_deletes_the_keys_it_no_longer_sends(local_lake, spark, hard, small_stream_bytes):
    full_table_refresh(local_lake, spark, hard, small_stream_bytes)
    names = {key: row["name"] for key, row in rows(local_lake).items()}
    if hard:
        assert names == {1: "v2 1", 2: "v2 2", 3: "v2 3"}
        assert "_sdc_deleted_at" not in table(local_lake).schema().to_arrow().names  # hard adds no column
    else:
        assert names == {1: "v2 1", 2: "v2 2", 3: "v2 3", 4: "v1 4", 5: "v1 5"}
        gone = received(local_lake, 2)
        assert {key: utc(at) for key, at in deleted_at(local_lake).items()} == {1: None, 2: None, 3: None, 4: gone, 5: gone}
        assert str(table(local_lake).to_pyarrow_table().schema.field("_sdc_deleted_at").type) == "timestamp[us, tz=UTC]"
    if small_stream_bytes == LARGE:  # key 4's bucket holds no key of version 2: the activation reaches untouched buckets too
        buckets = delta.latest(local_lake.storage, table_key(TAP, STREAM)).state["buckets"]
        assert bucket_of(json_text([4]), buckets) not in {bucket_of(json_text([i]), buckets) for i in (1, 2, 3)}
    assert project(open_lake(local_lake), spark, TAP, hard_delete=hard) == [], "nothing new: the stream is not visited"
    again = run(local_lake, spark, hard, small_stream_bytes, STREAM)  # planned all the same: activations not applied twice
    assert again["version"] == 1 and table(local_lake).version() == 1


@pytest.mark.parametrize("hard", [False, True], ids=["soft", "hard"])
def test_an_activation_landed_alone_after_the_last_run_is_applied_once(local_lake, spark, hard):
    """An ACTIVATE_VERSION with no record after it sits exactly at the previous run's position."""
    send(local_lake, *(record({"id": i, "name": "one"}, 1) for i in range(1, 4)))
    run(local_lake, spark, hard, SMALL)
    send(local_lake, record({"id": 1, "name": "two"}, 2))
    run(local_lake, spark, hard, SMALL)
    assert sorted(rows(local_lake)) == [1, 2, 3]
    send(local_lake, activate(2))
    assert run(local_lake, spark, hard, SMALL)["version"] == 2
    if hard:
        assert sorted(rows(local_lake)) == [1]
    else:
        gone = received(local_lake, 2)
        assert {key: utc(at) for key, at in deleted_at(local_lake).items()} == {1: None, 2: gone, 3: gone}
    send(local_lake, record({"id": 3, "name": "incremental"}))  # after the activation: kept, whatever its version
    assert run(local_lake, spark, hard, SMALL)["version"] == 3
    assert rows(local_lake)[3]["name"] == "incremental" and (hard or rows(local_lake)[3]["_sdc_deleted_at"] is None)
    assert sorted(rows(local_lake)) == ([1, 3] if hard else [1, 2, 3])


DELETED = "2024-06-01T12:00:00.000000Z"
FILLER = [{"id": i, "name": f"filler {i} " * 8} for i in range(100, 400)]  # room for several buckets on the large path


def log_based(lake: LakeUnderTest, spark, hard: bool, small_stream_bytes: int, schema: dict = SCHEMA) -> None:
    """Key 1 inserted, updated, then deleted at the source (`_sdc_deleted_at`), key 2 inserted."""
    messages = [record({"id": 1, "name": "new"}), record({"id": 2, "name": "kept"}), *map(record, FILLER)]
    send(lake, *messages, schema=schema)
    run(lake, spark, hard, small_stream_bytes)
    send(lake, record({"id": 1, "name": "updated"}), record({"id": 1, "name": "updated", "_sdc_deleted_at": DELETED}), schema=schema)
    run(lake, spark, hard, small_stream_bytes)


WITH_DELETED_AT = {"type": "object", "properties": {**SCHEMA["properties"], "_sdc_deleted_at": {"type": ["null", "string"]}}}


@pytest.mark.parametrize("schema", [SCHEMA, WITH_DELETED_AT], ids=["undeclared", "declared-string"])
@pytest.mark.parametrize("small_stream_bytes", [SMALL, LARGE], ids=["small", "large"])
@pytest.mark.parametrize("hard", [False, True], ids=["soft", "hard"])
def test_sdc_deleted_at_deletes_a_key_and_a_later_record_brings_it_back(local_lake, spark, hard, small_stream_bytes, schema):
    log_based(local_lake, spark, hard, small_stream_bytes, schema)
    found = rows(local_lake)
    assert found[2]["name"] == "kept" and len(found) == len(FILLER) + (1 if hard else 2)
    if hard:
        assert 1 not in found
    else:
        at = found[1]["_sdc_deleted_at"]
        expected = datetime(2024, 6, 1, 12, tzinfo=timezone.utc) if schema is SCHEMA else DELETED  # declared: typed as declared
        assert found[1]["name"] == "updated" and (utc(at) if schema is SCHEMA else at) == expected and found[2]["_sdc_deleted_at"] is None
    before = delta.latest(local_lake.storage, table_key(TAP, STREAM)).state
    send(local_lake, record({"id": 1, "name": "back"}), schema=schema)
    run(local_lake, spark, hard, small_stream_bytes)
    found = rows(local_lake)
    assert found[1]["name"] == "back" and len(found) == len(FILLER) + 2
    if not hard:  # the column stays, though no row is deleted any more
        assert found[1]["_sdc_deleted_at"] is None
    if small_stream_bytes == LARGE:  # still incremental: only key 1's bucket is rewritten
        buckets = before["buckets"]
        assert buckets > 1
        log = local_lake.read(f"{table_key(TAP, STREAM)}/_delta_log/{2:020d}.json").decode()
        actions = [json.loads(line) for line in log.splitlines() if line.strip()]
        assert sum("add" in action for action in actions) == 1 and sum("remove" in action for action in actions) == 1
        after = delta.latest(local_lake.storage, table_key(TAP, STREAM)).state
        assert [part["bucket"] for part in after["parts"] if part not in before["parts"]] == [bucket_of(json_text([1]), buckets)]


def published(lake: LakeUnderTest) -> tuple[str, list[dict]]:
    data = table(lake).to_pyarrow_table()
    return str(data.schema), sorted(data.to_pylist(), key=lambda row: row["id"])


@pytest.mark.parametrize("hard", [False, True], ids=["soft", "hard"])
def test_small_and_large_streams_delete_the_same_rows(tmp_path_factory, spark, hard):
    from support.lakes import local_lake_at

    tables = []
    for small_stream_bytes in (SMALL, LARGE):
        lake = local_lake_at(tmp_path_factory.mktemp("same"))
        full_table_refresh(lake, spark, hard, small_stream_bytes)
        send(lake, record({"id": 2, "name": "gone", "_sdc_deleted_at": DELETED}, 2), record({"id": 9, "name": "late"}))
        run(lake, spark, hard, small_stream_bytes)
        schema, found = published(lake)
        tables.append((schema, [{k: v for k, v in row.items() if k != "_sdc_deleted_at"} for row in found]))
        assert sorted(row["id"] for row in found) == ([1, 3, 9] if hard else [1, 2, 3, 4, 5, 9])
    assert tables[0] == tables[1]


def test_cli_hard_delete_projects_a_soft_table_anew(local_lake, spark):
    full_table_refresh(local_lake, spark, False, SMALL)
    assert sorted(rows(local_lake)) == [1, 2, 3, 4, 5]
    out = run_cli(local_lake, "project", "--hard-delete")
    assert out.returncode == 0, out.stderr[-3000:]
    assert sorted(rows(local_lake)) == [1, 2, 3] and table(local_lake).version() == 2
    state = delta.latest(local_lake.storage, table_key(TAP, STREAM)).state
    assert state["deletes"] == "hard" and state["activations"] == 2
    assert "_sdc_deleted_at" not in table(local_lake).schema().to_arrow().names


def test_a_run_killed_before_its_commit_leaves_the_table_and_the_next_run_applies_the_activation(local_lake, spark, monkeypatch):
    send(local_lake, *(record({"id": i, "name": "one"}, 1) for i in range(1, 4)), activate(1))
    run(local_lake, spark, False, SMALL)
    send(local_lake, record({"id": 1, "name": "two"}, 2), activate(2))

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed before the commit")

    with monkeypatch.context() as patched:
        patched.setattr(delta, "commit", killed)
        with pytest.raises(KeyboardInterrupt):
            run(local_lake, spark, False, SMALL)
    assert table(local_lake).version() == 0 and set(deleted_at(local_lake).values()) == {None}
    assert run(local_lake, spark, False, SMALL)["version"] == 1
    gone = received(local_lake, 2)
    assert {key: utc(at) for key, at in deleted_at(local_lake).items()} == {1: None, 2: gone, 3: gone}


def test_a_table_written_before_deletes_existed_is_projected_anew(local_lake, spark):
    """Its state has no `deletes`: the first run applies every activation and `_sdc_deleted_at` to the whole stream."""
    send(local_lake, *(record({"id": i, "name": "one"}, 1) for i in range(1, 4)), record({"id": 4, "_sdc_deleted_at": DELETED}))
    send(local_lake, record({"id": 1, "name": "two"}, 2), activate(2))
    run(local_lake, spark, True, SMALL)
    published = delta.latest(local_lake.storage, table_key(TAP, STREAM))
    old = {k: v for k, v in published.state.items() if k not in ("deletes", "activations")}  # as the previous version wrote it
    schema = table(local_lake).to_pyarrow_table().schema
    delta.commit(local_lake.storage, table_key(TAP, STREAM), published, schema, [], [], False, old)
    assert table(local_lake).version() == 1 and sorted(rows(local_lake)) == [1]
    assert run(local_lake, spark, True, SMALL, STREAM)["version"] == 2  # nothing new, but anew: every row again, deletes applied
    assert sorted(rows(local_lake)) == [1] and len(delta_adds(local_lake, 2)) == 1
    assert delta.latest(local_lake.storage, table_key(TAP, STREAM)).state["deletes"] == "hard"


def delta_adds(lake: LakeUnderTest, version: int) -> list[str]:
    log = lake.read(f"{table_key(TAP, STREAM)}/_delta_log/{version:020d}.json").decode()
    return [json.loads(line)["add"]["path"] for line in log.splitlines() if '"add"' in line]
