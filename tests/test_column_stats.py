"""Column statistics in manifest entries (SPEC.md §5): landed files carry what their values need,
the data source and `sql --raw` type a stream from them, compaction keeps them, and repair and
upgrade give them to entries written without them. On `local-cluster` (heavy), loading the data
source reads no data file on the driver: a read probe (a ``sitecustomize`` on PYTHONPATH, as in
test_target_cluster.py) logs every data-file read with the reading process's ancestry."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from decimal import Decimal
from pathlib import Path

import pytest
from singerlake import Lake
from singerlake.format.catalogue import replay_schema
from singerlake.format.datafile import open_data_file
from singerlake.format.exact import decode, join_all, records_needs
from singerlake.format.needs import entry_fields, properties_of, stored_needs
from singerlake.jobs.compact import compact_stream
from singerlake.jobs.repair import repair
from singerlake.jobs.upgrade import upgrade
from singerlake.replay.plan import columns, file_needs, plan_files, planned_needs
from singerlake.sources import register
from singerlake.spark.session import spark_session
from support.lakes import TAP, joined, land, local_lake_at, record_msg, schema_msg
from support.probes import write_probe

STREAM = "things"
SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "big": {"type": ["integer", "null"]},
        "amount": {"type": ["number", "null"]},
        "payload": {},
        "nested": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "number"}}},
        },
        "tags": {"type": "array", "items": {"type": "string"}},
        "when": {"type": "string", "format": "date-time"},
        "flag": {"type": "boolean"},
    },
}
# v2: `amount` becomes a string (another shape), `note` is new
SCHEMA_2 = {"type": "object", "properties": {**SCHEMA["properties"], "amount": {"type": "string"}, "note": {"type": "string"}}}


def thing(n: int) -> dict:
    record = {
        "id": n,
        "big": 123456789012345678901234567890 + n if n % 3 == 0 else n,
        "amount": f"{n}.{n % 7:02d}5",
        "payload": {"k": [n, "x"]} if n % 2 else "text",
        "nested": {"a": n, "b": [1.5, n]},
        "tags": ["a", str(n)],
        "when": f"2024-01-01T00:00:{n % 60:02d}Z",
        "flag": n % 2 == 0,
    }
    if n == 7:
        record["extra"] = 1  # a key the schema does not declare
    return record


def things_input(count: int = 40, v2: int = 0) -> bytes:
    lines = [schema_msg(STREAM, SCHEMA, ["id"])]
    for n in range(count):
        text = json.dumps(thing(n)).replace(f'"{thing(n)["amount"]}"', thing(n)["amount"])  # amount as a JSON number
        lines.append(record_msg(STREAM, text, "2024-01-01T00:00:00Z"))
    if v2:
        lines.append(schema_msg(STREAM, SCHEMA_2, ["id"]))
        lines += [record_msg(STREAM, {"id": 1000 + n, "amount": f"s{n}", "note": "hi"}) for n in range(v2)]
    return joined(lines)


@pytest.fixture(scope="module")
def spark():
    session = spark_session("local[2]", "singerlake-tests")
    register(session)
    return session


def read_needs(lake: Lake, entry: dict) -> dict:
    """What reading the file gives: ``exact`` over its decoded records, under its own schema."""
    schema = lake.manifest(TAP, STREAM).versions[entry["schema_hash"]]["schema"]
    with open_data_file(lake.storage, entry) as unzipped:
        unzipped.readline()
        records = [decode(line).get("record", {}) for line in unzipped]
    undeclared = {key for record in records for key in record} - properties_of(schema).keys()
    return entry_fields(properties_of(schema), records_needs(properties_of(schema), records), undeclared)


def strip_needs(lake: Lake) -> None:
    """Make every entry an old one (no statistics), as written before 2.1."""

    def change(current) -> bool:
        current.tail = [{k: v for k, v in e.items() if k not in ("needs", "undeclared")} for e in current.tail]
        return True

    assert not lake.manifest(TAP, STREAM).parts, "the test lakes keep every entry in the tail"
    lake.update_manifest(lake.paths(TAP, STREAM), change)


def frame_of(spark, root: str, **options):
    reader = spark.read.format("singerlake").option("tap_id", TAP).option("stream", STREAM)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load(root)


def test_landed_entries_carry_what_reading_their_files_gives(tmp_path):
    lake_ut = local_lake_at(tmp_path)
    land(lake_ut.config, things_input(), batch_max_rows=15)
    lake = Lake(lake_ut.storage)
    entries = lake.manifest(TAP, STREAM).files
    assert len(entries) >= 3
    for entry in entries:
        assert {"needs": entry["needs"], **({"undeclared": entry["undeclared"]} if "undeclared" in entry else {})} == read_needs(
            lake, entry
        )
    joined_needs = join_all([stored_needs(e, SCHEMA["properties"]) for e in entries])
    assert joined_needs["big"] == ["decimal", 30, 0] and joined_needs["id"] == "long"
    assert joined_needs["amount"][0] == "decimal" and joined_needs["payload"] == "json"
    assert joined_needs["nested"] == {"struct": {"a": "long", "b": {"list": ["decimal", 2, 1]}}}
    assert joined_needs["tags"] == {"list": "string"} and joined_needs["when"] == "timestamp" and joined_needs["flag"] == "bool"
    assert [e["undeclared"] for e in entries if "undeclared" in e] == [["extra"]]
    plain = entries[0]["needs"]
    assert "id" not in plain and "flag" not in plain and "when" not in plain, "plain needs are left out"


def test_the_data_source_types_a_stream_from_statistics_as_reading_it_would(tmp_path, spark):
    lake_ut = local_lake_at(tmp_path)
    land(lake_ut.config, things_input(v2=5), batch_max_rows=15)
    lake = Lake(lake_ut.storage)
    manifest = lake.manifest(TAP, STREAM)
    for schema, hashes in [(replay_schema(manifest), set(manifest.versions))] + [
        (info["schema"], {h}) for h, info in manifest.versions.items()
    ]:
        properties = schema["properties"]
        files = plan_files(manifest, hashes, None, manifest.commits)
        read = join_all([file_needs(lake.storage, properties, file) for file in files])
        found = planned_needs(lake.storage, manifest.versions, properties, files)
        assert columns(schema, found) == columns(schema, read)
    frame = frame_of(spark, lake_ut.config["lake_root"])
    types = dict(frame.dtypes)
    assert types["big"] == "decimal(30,0)" and types["amount"] == "string" and types["note"] == "string"
    rows = frame.orderBy("_singerlake_commit", "_singerlake_index").collect()
    assert len(rows) == 45 and rows[0]["big"] == Decimal("123456789012345678901234567890")
    assert json.loads(rows[1]["payload"]) == {"k": [1, "x"]}


def test_an_old_entry_is_read_as_before_and_repair_and_upgrade_add_its_statistics(tmp_path, spark):
    lake_ut = local_lake_at(tmp_path)
    land(lake_ut.config, things_input(), batch_max_rows=15)
    lake = Lake(lake_ut.storage)
    landed = {e["id"]: e for e in lake.manifest(TAP, STREAM).files}
    before = frame_of(spark, lake_ut.config["lake_root"])
    expected_types, expected_rows = before.dtypes, before.orderBy("_singerlake_commit", "_singerlake_index").collect()
    for backfill in ("upgrade", "repair"):
        strip_needs(lake)
        assert all("needs" not in e for e in lake.manifest(TAP, STREAM).files)
        old = frame_of(spark, lake_ut.config["lake_root"])
        assert old.dtypes == expected_types and old.orderBy("_singerlake_commit", "_singerlake_index").collect() == expected_rows
        if backfill == "upgrade":
            listed = upgrade(lake, apply=False)
            assert [(u.stream, u.statistics) for u in listed] == [(STREAM, len(landed))]
            upgrade(lake, apply=True, spark=lambda: spark)
            assert upgrade(lake, apply=False) == []
        else:
            actions = repair(lake, spark, apply=True)
            assert any(f"add column statistics to {len(landed)} file entries" in str(a) for a in actions)
        after = {e["id"]: e for e in lake.manifest(TAP, STREAM).files}
        assert after == landed, f"{backfill} gives each entry what landing gave it"
    assert repair(lake, spark, apply=False) == []


def test_compaction_keeps_the_statistics(tmp_path, spark):
    lake_ut = local_lake_at(tmp_path)
    land(lake_ut.config, things_input(60), batch_max_rows=10)
    lake = Lake(lake_ut.storage)
    sources = lake.manifest(TAP, STREAM).files
    # one source without statistics: compaction reads its records for them
    lake.update_manifest(
        lake.paths(TAP, STREAM),
        lambda m: setattr(m, "tail", [{k: v for k, v in e.items() if k != "needs" or e is not m.tail[1]} for e in m.tail]) or True,
    )
    compact_stream(lake, spark, TAP, STREAM, target_bytes=1 << 20)
    merged = lake.manifest(TAP, STREAM).files
    assert len(merged) == 1 and "runs" in merged[0]
    joined_needs = join_all([stored_needs(e, SCHEMA["properties"]) for e in sources])
    assert stored_needs(merged[0], SCHEMA["properties"]) == joined_needs
    assert {"needs": merged[0]["needs"], "undeclared": merged[0]["undeclared"]} == read_needs(lake, merged[0])


# -- local-cluster: no data file is read on the driver ------------------------------------------------
# One Spark session for both loads (one local-cluster start, not two): each line on stdin loads and
# collects the stream again, and the test changes the lake in between.
CLUSTER_SCRIPT = """
import json, sys
from singerlake.sources import register
from singerlake.spark.session import spark_session

root, log = sys.argv[1], sys.argv[2]
spark = spark_session("local-cluster[2,1,1024]", "singerlake-column-stats")
register(spark)


def mark(phase):
    with open(log, "a") as handle:
        handle.write(json.dumps({"phase": phase}) + "\\n")


for _ in sys.stdin:
    frame = spark.read.format("singerlake").option("tap_id", "tap-test").option("stream", "things").load(root)
    types = frame.dtypes
    mark("loaded")
    rows = [row.asDict(recursive=True) for row in frame.orderBy("_singerlake_commit", "_singerlake_index").collect()]
    mark("collected")
    print(json.dumps({"types": types, "rows": rows}, default=str), flush=True)
spark.stop()
"""


def nearest_jvm(entry: dict) -> str:
    return next(p["cmdline"] for p in entry["ancestry"][1:] if p["cmdline"].split(" ", 1)[0].endswith("/java"))


class ClusterReader:
    """A process with one local-cluster Spark session; each ``read`` loads and collects the stream anew."""

    def __init__(self, tmp_path: Path, root: str):
        probe = write_probe(tmp_path / "probe", "SINGERLAKE_TEST_READ_LOG", ("read", "open_read"))
        self.log, self.stderr, self.seen = tmp_path / "reads.jsonl", tmp_path / "cluster.stderr", 0
        env = {**os.environ, "SINGERLAKE_TEST_READ_LOG": str(self.log)}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(probe), env.get("PYTHONPATH")]))
        with open(self.stderr, "wb") as err:
            command = [sys.executable, "-c", CLUSTER_SCRIPT, root, str(self.log)]
            self.proc = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
        self.results: queue.Queue = queue.Queue()
        threading.Thread(target=self._gather, daemon=True).start()

    def _gather(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.results.put(json.loads(line))
        self.results.put(None)  # the process ended

    def read(self) -> tuple[dict, list[dict], list[dict]]:
        """Load and collect the stream; the result, and the data-file reads before and after loading."""
        self.proc.stdin.write("load\n")
        self.proc.stdin.flush()
        try:
            result = self.results.get(timeout=600)
        except queue.Empty:
            result = None
        assert result is not None, self.stderr.read_text(errors="replace")[-3000:]
        lines = [json.loads(line) for line in self.log.read_text().splitlines()][self.seen :]
        self.seen += len(lines)
        cut, end = lines.index({"phase": "loaded"}), lines.index({"phase": "collected"})
        assert end == len(lines) - 1, "no read after the collect"
        return result, lines[:cut], lines[cut + 1 : end]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=600)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        assert self.proc.returncode == 0, self.stderr.read_text(errors="replace")[-3000:]


@pytest.mark.heavy
def test_on_local_cluster_loading_the_data_source_reads_no_data_file_on_the_driver(tmp_path):
    lake_ut = local_lake_at(tmp_path)
    land(lake_ut.config, things_input(), batch_max_rows=15)
    lake = Lake(lake_ut.storage)
    files = len(lake.manifest(TAP, STREAM).files)
    reader = ClusterReader(tmp_path, lake_ut.config["lake_root"])
    try:
        result, loading, collecting = reader.read()
        assert loading == [], f"loading read data files: {[r['key'] for r in loading]}"
        assert len({r["key"] for r in collecting}) == files, "the executors read every file"
        assert all("CoarseGrainedExecutorBackend" in nearest_jvm(r) for r in collecting), "only executors read data files"
        types = dict(map(tuple, result["types"]))
        assert types["big"] == "decimal(30,0)" and types["payload"] == "string" and types["id"] == "bigint"
        assert types["nested"] == "struct<a:bigint,b:array<decimal(3,1)>>" and types["when"] == "timestamp"
        rows = result["rows"]
        assert len(rows) == 40 and rows[0]["big"] == "123456789012345678901234567890" and rows[3]["nested"]["b"] == ["1.5", "3.0"]
        # The control: without statistics, the same load reads every file on the driver (the probe sees it).
        strip_needs(lake)
        again, loading, _ = reader.read()
        assert len({r["key"] for r in loading}) == files
        assert not any("CoarseGrainedExecutorBackend" in nearest_jvm(r) for r in loading)
        assert again == result
    finally:
        reader.close()
