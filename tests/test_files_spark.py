"""#22 on Spark: a push of many files stored by the executors, and ``format("singerlake-files")``, the index as a DataFrame."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from singerlake.files import push as push_module
from singerlake.files import spark_push
from singerlake.files.store import Source
from singerlake.lake import Lake
from singerlake.sources import register
from singerlake.spark.session import spark_session
from singerlake.storage import S3Storage, open_storage
from singerlake.times import parse_time_ms
from support.cli_session import CliSession
from support.lakes import local_lake_at, s3_lake_at
from support.s3_servers import S3_KEYS, s3_root_on
from support.spark_jobs import measured, measured_in

CLI = shutil.which("singerlake", path=str(Path(sys.executable).parent)) or "singerlake"
DAY_MS = 24 * 3600 * 1000
T0 = parse_time_ms("2026-03-01T00:00:00Z")


@pytest.fixture(scope="module")
def spark():
    session = spark_session("local[2]", "singerlake-tests")
    register(session)
    return session


def many_files(directory: Path, count: int) -> dict[str, bytes]:
    """``count`` small files of distinct bytes in a few subdirectories (one empty, some binary); path -> bytes."""
    made = {}
    for n in range(count):
        data = b"" if n == 0 else (f"line {n}\n" * (n % 5 + 1)).encode() + (bytes(range(256)) if n % 7 == 0 else b"")
        path = directory / f"d{n % 8}" / f"f{n:05d}.{'bin' if n % 7 == 0 else 'log'}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        made[str(path.absolute())] = data
    return made


def cli(root: str, *args: str, options: dict | None = None, session: CliSession | None = None) -> subprocess.CompletedProcess:
    """``singerlake ARGS[0] ROOT ...`` as a process, or through main() in ``session`` (whose environment has the S3 keys)."""
    env = {**os.environ, "AWS_EC2_METADATA_DISABLED": "true"}
    extra: list[str] = []
    if options:  # S3: keys in the environment (driver and executors inherit it), endpoint and region as options
        env.update(AWS_ACCESS_KEY_ID=options["access_key_id"], AWS_SECRET_ACCESS_KEY=options["secret_access_key"])
        extra = ["--s3-endpoint-url", options["endpoint_url"], "--s3-region", options["region"]]
    argv = [args[0], root, *extra, *args[1:]]
    if session is not None:
        return session.run(*argv)
    return subprocess.run([CLI, *argv], capture_output=True, text=True, timeout=600, env=env)


@pytest.fixture(scope="module")
def push_cli():
    """One CliSession for the module's pushes over the CLI, whatever their lake (every S3 server takes the same keys):
    one Spark start (local[2]) for them all instead of one per push."""
    keys = {"AWS_ACCESS_KEY_ID": S3_KEYS["access_key_id"], "AWS_SECRET_ACCESS_KEY": S3_KEYS["secret_access_key"]}
    with CliSession({**os.environ, "AWS_EC2_METADATA_DISABLED": "true", **keys}) as session:
        yield session


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def push_many_over_the_cli(tmp_path: Path, root: str, count: int, session: CliSession, options: dict | None = None) -> None:
    def run(*args: str) -> list | dict:
        return json.loads(ok(cli(root, *args, options=options, session=session)).stdout)

    made = many_files(tmp_path / "src", count)
    with measured_in(session, "local[2]") as spark_ran:
        started = time.monotonic()
        pushed = run("push", str(tmp_path / "src"), "--what", "photos", "--where", "cam-1", "--work-id", "batch-7",
                     "--spark", "always", "--spark-master", "local[2]", "--json")  # fmt: skip
        took = time.monotonic() - started
    assert len(pushed["pushed"]) == count and pushed["duplicates"] == []
    # One Spark job ran the stores, as Spark saw it: its tasks on the executors' Python workers (not the driver's).
    assert [job["status"] for job in spark_ran.jobs] == ["SUCCEEDED"] and spark_ran.tasks >= 2, spark_ran
    assert pushed["spark"] == {"jobs": 1, "tasks": spark_ran.tasks, "worker_processes": pushed["spark"]["worker_processes"]}
    assert pushed["spark"]["worker_processes"] >= 1
    print(f"{count} files pushed on local[2] in {took:.1f} s")

    found = run("files", "--what", "photos", "--work-id", "batch-7", "--fetch", str(tmp_path / "out"), "--json")
    assert sorted(r["path"] for r in found) == sorted(made)
    assert {r["txn"] for r in found} == {r["txn"] for r in pushed["pushed"]}
    for record in found:
        assert (tmp_path / "out" / f"{record['id']}-{record['name']}").read_bytes() == made[record["path"]]
    by_time = run("files", "--what", "photos", "--start", "2000-01-01", "--json")
    assert sorted(r["id"] for r in by_time) == sorted(r["id"] for r in found)


# -- push on Spark -----------------------------------------------------------------------------------
def test_a_push_of_many_files_runs_on_spark_executors_and_every_file_comes_back_whole(tmp_path, push_cli):
    # 400 files: spark_push's full 4 tasks per core on local[2] (50 files each, above MIN_FILES_PER_TASK) and far
    # more files than the fetch's parallel requests; bench/files.py measures large pushes (2000 here cost ~20 s).
    push_many_over_the_cli(tmp_path, str(tmp_path / "lake"), 400, push_cli)


@pytest.mark.heavy
def test_a_push_on_spark_into_an_s3_lake_over_the_cli(tmp_path, s3_root, push_cli):
    """The executors reach the bucket with the driver's options and the environment's keys."""
    url, options = s3_root
    push_many_over_the_cli(tmp_path, url, 200, push_cli, options)


def test_lake_push_on_spark_into_an_s3_lake(tmp_path, spark, moto_server):
    """The storage travels to the executors pickled (its client dropped), keys and endpoint with it."""
    bucket = f"lake-{os.urandom(6).hex()}"
    storage = S3Storage(f"s3://{bucket}/lake", **moto_server.options())
    storage.client.create_bucket(Bucket=bucket)
    made = many_files(tmp_path / "src", 100)
    lake = Lake(storage)
    with measured(spark) as spark_ran:
        result = lake.push(tmp_path / "src", what="photos", where="cam-1", work_id="b1", spark=spark, use_spark="always")
    assert [job["status"] for job in spark_ran.jobs] == ["SUCCEEDED"] and len(result.pushed) == 100
    assert result.spark["jobs"] == spark_ran.count and result.spark["tasks"] == spark_ran.tasks
    found = lake.find_files("photos", work_id="b1")
    assert sorted(r["path"] for r in found) == sorted(made)
    for record in found[::9]:
        assert (
            lake.fetch(record["id"], str(tmp_path / "out" / record["id"]))
            and (tmp_path / "out" / record["id"]).read_bytes() == made[record["path"]]
        )


def test_auto_pushes_a_few_files_on_threads_without_starting_spark(tmp_path):
    many_files(tmp_path / "src", 3)
    pushed = json.loads(ok(cli(str(tmp_path / "lake"), "push", str(tmp_path / "src"), "--what", "a", "--where", "b", "--json")).stdout)
    assert len(pushed["pushed"]) == 3 and "spark" not in pushed


def test_a_cluster_push_needs_the_files_shared_with_its_executors(tmp_path):
    many_files(tmp_path / "src", 2)
    root = str(tmp_path / "lake")
    args = ("push", str(tmp_path / "src"), "--what", "a", "--where", "b", "--spark-master", "spark://127.0.0.1:1")
    result = cli(root, *args)
    assert result.returncode == 2 and "--lake-root-shared" in result.stderr  # the lake root first, as every Spark command
    result = cli(root, *args, "--lake-root-shared")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "files to push are on this machine's disk" in result.stderr and "--source-shared" in result.stderr
    assert not (tmp_path / "lake" / "files").exists()


def test_lake_push_given_a_session_runs_a_push_over_the_threshold_on_it(tmp_path, spark, monkeypatch):
    made = many_files(tmp_path / "src", 40)
    lake = Lake.open(str(tmp_path / "lake"))
    with measured(spark) as spark_ran:
        assert lake.push(tmp_path / "src" / "d0", what="w", where="x", spark=spark).spark is None  # 5 files: threads
    assert spark_ran.jobs == [], "no Spark job under the threshold"
    monkeypatch.setattr(push_module, "SPARK_FILES", 30)
    monkeypatch.setattr(spark_push, "COMMIT_FILES", 16)  # three chunks, three segments
    seen = []
    with measured(spark) as spark_ran:
        result = lake.push(
            tmp_path / "src", what="w", where="x", work_id="r1", spark=spark, progress=lambda done, total: seen.append(total)
        )
    assert [job["status"] for job in spark_ran.jobs] == ["SUCCEEDED"] and len(result.pushed) == 35 and len(result.duplicates) == 5
    assert result.spark["jobs"] == spark_ran.count and result.spark["tasks"] == spark_ran.tasks
    assert len({r["txn"] for r in result.pushed + result.duplicates}) == 4 and set(seen) == {40}
    assert len(list(lake.storage.list("files/index/w/segments/"))) == 1 + 3
    assert sorted(r["path"] for r in lake.find_files("w", work_id="r1")) == sorted(p for p in made if "/d0/" not in p)


def test_a_file_the_executors_cannot_read_fails_its_chunk_only(tmp_path, spark, monkeypatch):
    made = many_files(tmp_path / "src", 4)
    storage = open_storage(str(tmp_path / "lake"))
    storage.check_writable()
    sources = [Source(Path(p), len(data), os.stat(p).st_mtime_ns, T0, None) for p, data in sorted(made.items())]
    sources.append(Source(tmp_path / "gone.txt", 3, 0, T0, None))
    monkeypatch.setattr(spark_push, "COMMIT_FILES", 2)
    with pytest.raises(spark_push.PushFailed, match=r"1 file could not be pushed \(4 files committed.*gone.txt"):
        spark_push.push_on_spark(spark, storage, sources, what="w", where="x", work_id="r1")
    assert sorted(r["path"] for r in Lake(storage).find_files("w", work_id="r1")) == sorted(made)


def test_the_same_bytes_in_two_chunks_of_a_spark_push_are_committed_once_and_fetchable(tmp_path, spark, monkeypatch):
    made = many_files(tmp_path / "src", 3)
    copy = tmp_path / "copy.log"
    copy.write_bytes(made[sorted(made)[1]])
    storage = open_storage(str(tmp_path / "lake"))
    storage.check_writable()
    sources = [Source(Path(p), len(made[p]), os.stat(p).st_mtime_ns, T0, None) for p in sorted(made)]
    sources.append(Source(copy, copy.stat().st_size, copy.stat().st_mtime_ns, T0, None))
    monkeypatch.setattr(spark_push, "COMMIT_FILES", 3)  # the copy alone in a second chunk, stored at once with the first
    result = spark_push.push_on_spark(spark, storage, sources, what="w", where="x", work_id=None)
    assert len(result.pushed) == 3 and [r["path"] for r in result.duplicates] == [str(copy)]
    lake = Lake(storage)
    record = lake.file_record(result.duplicates[0]["id"])  # its record file names the committed push
    assert record["path"] == sorted(made)[1] and record["txn"] == result.pushed[0]["txn"]
    assert len(list(storage.list("files/index/w/segments/"))) == 1


# -- the data source ---------------------------------------------------------------------------------
def files_lake(lake: Lake, directory: Path) -> dict[str, bytes]:
    """Files of two wheres over five days, two work ids, one spanning 40 days (the long/ bucket); path -> bytes."""
    made = {}
    for n in range(30):
        path = directory / f"p{n}" / f"file{n}.txt"
        path.parent.mkdir(parents=True)
        path.write_bytes(f"bytes of file {n}\n".encode() * (n + 1))
        made[str(path.absolute())] = path.read_bytes()
        start = T0 + (n % 5) * DAY_MS + n * 1000
        end = start + 40 * DAY_MS if n == 5 else (None if n % 2 else start + 3600_000)
        lake.push(path, what="syslog", where="web" if n % 3 else "db", work_id=f"run-{n % 2}", start=start, end=end)
    return made


@pytest.fixture(params=["local", "moto", pytest.param("seaweedfs", marks=pytest.mark.heavy)])
def files_in(request, tmp_path) -> tuple[Lake, dict, dict[str, str]]:
    """A lake on each backend with ``files_lake``'s files, and the data source's options to reach it."""
    lake = local_lake_at(tmp_path) if request.param == "local" else s3_lake_at(s3_root_on(request))
    opened = Lake(lake.storage)
    made = files_lake(opened, tmp_path / "src")
    options = {f"s3_{name}": value for name, value in lake.storage.open_options().items()}
    return opened, made, {"path": lake.config["lake_root"], **options}


def read(spark, options: dict[str, str], **query: str):
    return spark.read.format("singerlake-files").options(**options, **query).load()


def as_records(frame) -> list[dict]:
    rows = frame.selectExpr("*", "unix_millis(start) AS start_ms", "unix_millis(`end`) AS end_ms").collect()
    records = []
    for row in rows:
        record = row.asDict()
        record["start"], record["end"] = record.pop("start_ms"), record.pop("end_ms")
        records.append(record)
    return records


def test_the_files_data_source_gives_the_rows_of_find_files(spark, files_in):
    lake, made, options = files_in
    start, end = "2026-03-02T00:00:00Z", "2026-03-03T12:00:00Z"
    expected = lake.find_files("syslog", start=start, end=end)
    assert 5 < len(expected) < 30 and any(r["end"] is not None and r["end"] - r["start"] > 31 * DAY_MS for r in expected)
    assert as_records(read(spark, options, what="syslog", start=start, end=end)) == expected

    expected = lake.find_files("syslog", where="we", work_id="run-1")
    assert 5 < len(expected) < 15
    assert as_records(read(spark, options, what="syslog", where="we", work_id="run-1")) == expected

    frame = read(spark, options, what="syslog", start="2026-01-01", content="true")
    assert frame.rdd.getNumPartitions() > 1  # content read in parallel
    rows = frame.select("path", "content", "size").collect()
    assert len(rows) == 30 and all(bytes(row["content"]) == made[row["path"]] and row["size"] == len(row["content"]) for row in rows)


def test_the_files_data_source_reads_only_the_index_it_asks_for(spark, tmp_path, monkeypatch):
    lake = Lake.open(str(tmp_path / "lake"))
    files_lake(lake, tmp_path / "src")
    frame = read(spark, {"path": str(tmp_path / "lake")}, what="syslog", work_id="run-0")
    assert frame.count() == 15 and "content" not in frame.columns
    empty = read(spark, {"path": str(tmp_path / "lake")}, what="syslog", start="2030-01-01", end="2030-01-02", content="true")
    assert empty.count() == 0 and empty.columns[-1] == "content"
    with pytest.raises(Exception, match="say which files"):
        read(spark, {"path": str(tmp_path / "lake")}, what="syslog").collect()
