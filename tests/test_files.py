"""Any file in the lake (SPEC.md §14, issue #22): push, the four datalake queries and latest, fetch,
dedup, streamed S3 multipart writes, bad input, concurrent pushes and pushes killed with SIGKILL.

Most tests run the real CLI in a subprocess over a local lake, moto and SeaweedFS, and compare
what it finds with a brute-force filter over the records pushed.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from singerlake.files import store as store_module
from singerlake.files.errors import FileChanged
from singerlake.files.fetch import copy_verified
from singerlake.lake import Lake
from singerlake.storage import S3Storage
from singerlake.storage import s3 as s3_module
from support.files_roots import BASE, Root, assert_refused, cli_env, cli_s3_args, root_on
from support.s3_servers import BACKENDS, S3_SERVERS

DAY = 86_400_000
WHATS = ("nginx-access", "photo")
WHERES = ("web", "web02", "db_1")  # "web" is a prefix of "web02"
WORK_IDS = (None, "run-1", "run_2")
WHERE_PREFIXES = ("", "web", "web0", "web02", "db", "x")


# -- lake roots on every backend, for the API and for the CLI (support.files_roots) ---------------------
@pytest.fixture(params=BACKENDS)
def root(request, tmp_path) -> Root:
    return root_on(request, request.param, tmp_path)


@pytest.fixture(params=S3_SERVERS)
def s3_lake_root(request, tmp_path) -> Root:
    return root_on(request, request.param, tmp_path)


# -- what the index should answer: brute force over the records pushed ------------------------------
def last(record: dict) -> int:
    return record["start"] if record["end"] is None else record["end"]


def expected_by_time(records, whats, where, start, end) -> set[str]:
    return {r["id"] for r in records if r["what"] in whats and r["where"].startswith(where) and r["start"] <= end and last(r) >= start}


def expected_by_work_id(records, whats, where, work_id) -> set[str]:
    return {r["id"] for r in records if r["what"] in whats and r["where"].startswith(where) and r["work_id"] == work_id}


def expected_latest(records, what, where) -> set[str]:
    """The ids that may be the latest: the greatest last time, ties by the later ``created``."""
    candidates = [r for r in records if r["what"] == what and r["where"].startswith(where)]
    if not candidates:
        return set()
    best = max((last(r), r["created"]) for r in candidates)
    return {r["id"] for r in candidates if (last(r), r["created"]) == best}


def blake(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# -- 1. the queries against brute force ---------------------------------------------------------------
starts = st.one_of(
    st.integers(0, 12 * DAY),
    st.integers(0, 12).map(lambda d: d * DAY),  # at midnight
    st.integers(1, 12).map(lambda d: d * DAY - 1),  # the last ms of a day
)
spans = st.one_of(
    st.none(),  # an instant
    st.just(0),
    st.integers(1, DAY),  # often across midnight
    st.integers(DAY, 4 * DAY),  # several days
    st.integers(29 * DAY, 33 * DAY),  # around the long bucket's edge
    st.integers(32 * DAY, 60 * DAY),  # the long bucket
)
files_strategy = st.lists(
    st.tuples(st.sampled_from(WHATS), st.sampled_from(WHERES), st.sampled_from(WORK_IDS), starts, spans), min_size=1, max_size=12
)
time_query = st.tuples(
    st.just("time"),
    st.sampled_from([WHATS[:1], WHATS[1:], WHATS]),
    st.sampled_from(WHERE_PREFIXES),
    st.integers(-3 * DAY, 75 * DAY),
    st.one_of(st.integers(0, 2 * DAY), st.integers(0, 40 * DAY), st.just(0)),
)
work_query = st.tuples(
    st.just("work"), st.sampled_from([WHATS[:1], WHATS[1:], WHATS]), st.sampled_from(WHERE_PREFIXES), st.sampled_from(WORK_IDS[1:])
)
latest_query = st.tuples(st.just("latest"), st.sampled_from(WHATS), st.sampled_from(WHERE_PREFIXES))
queries_strategy = st.lists(st.one_of(time_query, work_query, latest_query), min_size=4, max_size=12)


def push_generated(root: Root, directory: Path, files) -> list[dict]:
    """Push each generated file through the API; returns the records committed."""
    directory.mkdir(parents=True)
    lake = root.lake
    records = []
    for number, (what, where, work_id, start, span) in enumerate(files):
        path = directory / f"f{number}.bin"
        path.write_bytes(f"file {number} {what} {where}\n".encode() + os.urandom(16))
        end = None if span is None else BASE + start + span
        result = lake.push(path, what=what, where=where, work_id=work_id, start=BASE + start, end=end)
        assert [r["path"] for r in result.pushed] == [str(path)] and not result.duplicates
        records.append(result.pushed[0])
    return records


def check_queries(lake: Lake, records: list[dict], queries) -> None:
    for query in queries:
        if query[0] == "time":
            _, whats, where, start, length = query
            first, last_ms = BASE + start, BASE + start + length
            found = lake.find_files(list(whats), where=where, start=first, end=last_ms)
            assert {r["id"] for r in found} == expected_by_time(records, whats, where, first, last_ms), query
        elif query[0] == "work":
            _, whats, where, work_id = query
            found = lake.find_files(list(whats), where=where, work_id=work_id)
            assert {r["id"] for r in found} == expected_by_work_id(records, whats, where, work_id), query
        else:
            _, what, where = query
            found_one = lake.latest_file(what, where)
            expected = expected_latest(records, what, where)
            assert (found_one["id"] if found_one else None) in (expected or {None}), query
            found = [found_one] if found_one else []
        assert len({r["id"] for r in found}) == len(found), f"{query}: a file listed twice"
        by_id = {r["id"]: r for r in records}
        for record in found:
            assert record == by_id[record["id"]], "the index returns the record pushed, whole"


def run_property(root: Root, tmp_path: Path, files, queries) -> None:
    example = os.urandom(6).hex()
    here = root.under(f"ex-{example}")
    records = push_generated(here, tmp_path / f"src-{example}", files)
    check_queries(here.lake, records, queries)


PROPERTY = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@PROPERTY
@given(files=files_strategy, queries=queries_strategy)
def test_queries_match_brute_force_on_a_local_lake(tmp_path, files, queries):
    run_property(Root("local", str(tmp_path / "lake")), tmp_path, files, queries)


@settings(PROPERTY, max_examples=4)
@given(files=files_strategy, queries=queries_strategy)
def test_queries_match_brute_force_on_s3(s3_lake_root, tmp_path, files, queries):
    run_property(s3_lake_root, tmp_path, files, queries)


# A fixed set of files for the CLI: every kind of span, pushed with times as users type them.
CLI_FILES = [
    # name, what, where, work_id, --start, --end
    ("a.log", "nginx-access", "web", "run-1", "2024-03-01T23:30:00Z", "2024-03-02T00:30:00Z"),  # across midnight
    ("b.log", "nginx-access", "web02", "run-1", str((BASE + 2 * DAY) // 1000), None),  # an instant, epoch seconds
    ("c.log", "nginx-access", "web02", None, str(BASE + 3 * DAY + 5), str(BASE + 7 * DAY)),  # ms, several days
    ("d.jpg", "photo", "db_1", "run_2", "2024-01-01", "2024-03-05T12:00:00Z"),  # over 31 days: long
    ("e.jpg", "photo", "web", None, "2024-03-04T00:00:00Z", "2024-03-04T00:00:00Z"),  # start == end at midnight
    ("f.log", "nginx-access", "db_1", "run_2", "2024-03-10T10:00:00+02:00", None),  # an offset
]
CLI_QUERIES = [
    ("nginx-access", "", "2024-03-02T00:00:00Z", "2024-03-02T00:00:00Z"),
    ("nginx-access", "web", "2024-03-01", "2024-03-03"),
    ("nginx-access,photo", "", "2024-02-01", "2024-02-02"),
    ("nginx-access,photo", "web0", "2024-03-05", "2024-03-06"),
    ("photo", "", str(BASE // 1000 + 3 * 86400), str(BASE + 3 * DAY + 1)),
    ("nginx-access", "db", "2024-03-10T08:00:00Z", "2024-03-10T08:00:00Z"),
]


def test_cli_queries_match_brute_force(root, tmp_path):
    with root.cli_session():  # the CLI's commands below in one process (each its own argv, exit code and output)
        cli_queries_match_brute_force(root, tmp_path)


def cli_queries_match_brute_force(root: Root, tmp_path: Path) -> None:
    records = []
    for name, what, where, work_id, start, end in CLI_FILES:
        path = tmp_path / "src" / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(f"{name}\n".encode() * 100)
        args = [
            "--what",
            what,
            "--where",
            where,
            "--start",
            start,
            *(["--work-id", work_id] if work_id else []),
            *(["--end", end] if end else []),
        ]
        result = root.cli_json("push", str(path), *args)
        assert result["duplicates"] == [] and len(result["pushed"]) == 1
        records.append(result["pushed"][0])
    by_name = {r["name"]: r for r in records}
    assert by_name["b.log"]["end"] is None and by_name["b.log"]["start"] == BASE + 2 * DAY
    assert by_name["c.log"]["start"] == BASE + 3 * DAY + 5 and by_name["f.log"]["start_iso"] == "2024-03-10T08:00:00.000Z"
    assert root.keys("files/index/photo/long/"), "a span over 31 days goes to the long bucket"

    on_s3 = root.kind != "local"  # the API's property test covers S3's answers; here a few CLI round trips
    for whats, where, start, end in [q for n, q in enumerate(CLI_QUERIES) if not on_s3 or n in (0, 2, 3)]:
        found = root.cli_json("files", "--what", whats, "--where", where, "--start", start, "--end", end)
        first, last_ms = _ms(start), _ms(end, end=True)
        assert {r["id"] for r in found} == expected_by_time(records, whats.split(","), where, first, last_ms), (whats, where, start, end)
        assert all(r in records for r in found)
    for whats, where, work_id in (
        ("nginx-access", "", "run-1"),
        ("nginx-access,photo", "", "run_2"),
        ("nginx-access", "web0", "run-1"),
        ("photo", "web", "run_2"),
    )[: 2 if on_s3 else 4]:
        found = root.cli_json("files", "--what", whats, "--where", where, "--work-id", work_id)
        assert {r["id"] for r in found} == expected_by_work_id(records, whats.split(","), where, work_id)
    for where, names in (("", ["f.log", "d.jpg"]), ("web", ["c.log", "e.jpg"])):  # one per what
        found = root.cli_json("files", "--what", "nginx-access,photo", "--where", where, "--latest")
        assert [r["name"] for r in found] == names, where
    assert root.cli_json("files", "--what", "photo", "--where", "x", "--latest") == []
    table = root.cli("files", "--what", "nginx-access", "--start", "2024-03-01", "--end", "2024-03-02").stdout.decode()
    assert by_name["a.log"]["id"] in table and "2024-03-01T23:30:00.000Z" in table


def _ms(text: str, end: bool = False) -> int:
    from singerlake.times import parse_when

    return parse_when(text, "test", end=end)


# -- 2. fetch gives the bytes back ----------------------------------------------------------------------
def source_tree(directory: Path) -> dict[str, bytes]:
    """Files of every shape: empty, every byte value, a nested one, a few MB (read whole), unicode names."""
    files = {
        "empty.dat": b"",
        "bytes.bin": bytes(range(256)) * 3,
        "sub/deeper/notes.txt": "héllo\r\nwörld\n".encode(),
        "sub/big.bin": random.Random(1).randbytes(3 << 20),
        "naïve name.csv": b"a,b\n1,2\n",
    }
    for name, data in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def test_fetch_returns_the_bytes_pushed(root, tmp_path):
    files = source_tree(tmp_path / "src")
    pushed = root.cli_json("push", str(tmp_path / "src"), "--what", "reports", "--where", "web02", "--start", "2024-03-01T12:00:00Z")
    records = {Path(r["path"]).relative_to(tmp_path / "src").as_posix(): r for r in pushed["pushed"]}
    assert sorted(records) == sorted(files) and pushed["duplicates"] == []
    for name, record in records.items():
        assert record["size"] == len(files[name]) and record["hash"] == blake(files[name]) and record["name"] == Path(name).name
        assert record["key"] == f"files/data/reports/web02/{record['id']}"
    assert records["sub/deeper/notes.txt"]["content_type"] == "text/plain"

    one = records["bytes.bin"]  # --out a file
    root.cli("fetch", one["id"], "--out", str(tmp_path / "one.out"))
    assert (tmp_path / "one.out").read_bytes() == files["bytes.bin"]
    names = sorted(records)  # --out -: the bytes on stdout, one file after the other, nothing else
    ids = [records[name]["id"] for name in names]
    assert root.cli("fetch", *ids, "--out", "-").stdout == b"".join(files[name] for name in names)

    root.cli("fetch", *ids, "--out", str(tmp_path / "dir"), "--name", "{where}/{what}-{start_iso}-{name}")  # a directory, named
    for name in records:
        assert (tmp_path / "dir" / "web02" / f"reports-2024-03-01T12:00:00.000Z-{Path(name).name}").read_bytes() == files[name]

    found = root.cli_json("files", "--what", "reports", "--start", "2024-03-01", "--end", "2024-03-02", "--fetch", str(tmp_path / "all"))
    assert sorted(r["id"] for r in found) == sorted(ids)
    fetched = {p.relative_to(tmp_path / "all").as_posix(): p.read_bytes() for p in (tmp_path / "all").rglob("*") if p.is_file()}
    assert fetched == {f"{r['id']}-{r['name']}": files[name] for name, r in records.items()}  # default name {id}-{name}
    assert not list((tmp_path / "all").rglob(".*")), "no temp file is left beside the fetched ones"

    missing = root.cli("fetch", "0" * 32, "--out", str(tmp_path / "nothing"), check=False)
    assert missing.returncode == 2 and "0" * 32 in missing.stderr.decode() and not (tmp_path / "nothing").exists()


def test_fetch_refuses_bytes_that_do_not_match_the_record(tmp_path):
    root = Root("local", str(tmp_path / "lake"))
    (tmp_path / "a.txt").write_bytes(b"original bytes")
    record = root.lake.push(tmp_path / "a.txt", what="notes", where="here", start=BASE).pushed[0]
    root.storage.write(record["key"], b"damaged bytes!")
    result = root.cli("fetch", record["id"], "--out", str(tmp_path / "out.txt"), check=False)
    assert result.returncode != 0 and record["id"] in result.stderr.decode()
    assert not (tmp_path / "out.txt").exists() and not list(tmp_path.glob(".out.txt*")), "a damaged copy never gets the file's name"


# -- 3. the same bytes again are found, not stored ----------------------------------------------------
def test_pushing_the_same_bytes_again_stores_nothing(root, tmp_path):
    files = source_tree(tmp_path / "src")
    labels = ["--what", "reports", "--where", "web", "--work-id", "run-1"]
    first = root.cli_json("push", str(tmp_path / "src"), *labels)
    assert len(first["pushed"]) == len(files)
    before = {key: root.storage.read_etag(key) for key in root.keys()}

    again = root.cli("push", str(tmp_path / "src"), *labels)
    text = again.stdout.decode()
    for record in first["pushed"]:
        assert f"already in the lake as {record['id']}" in text
    assert f"0 files pushed, {len(files)} already in the lake" in text
    copy = tmp_path / "copy.bin"  # the same bytes under another name and time: the same file
    copy.write_bytes(files["bytes.bin"])
    third = root.cli_json("push", str(copy), *labels, "--start", "2020-01-01")
    assert third["pushed"] == [] and [r["id"] for r in third["duplicates"]] == [
        r["id"] for r in first["pushed"] if r["name"] == "bytes.bin"
    ]
    after = {key: root.storage.read_etag(key) for key in root.keys()}
    assert after == before, "a second push writes nothing: no data, record, pointer or segment"
    assert len([k for k in after if k.startswith("files/data/")]) == len(files)

    elsewhere = root.cli_json("push", str(copy), "--what", "reports", "--where", "web02")  # another where: another file
    assert len(elsewhere["pushed"]) == 1 and elsewhere["pushed"][0]["id"] not in {r["id"] for r in first["pushed"]}
    assert len(root.keys("files/data/")) == len(files) + 1


# -- 4. large files: streamed, multipart on S3, nothing stored when they change ------------------------
@pytest.fixture
def small_parts(monkeypatch):
    """Parts of 5 MiB (S3's least but the last) and files over 1 MiB streamed, so a 12 MiB file takes three parts."""
    monkeypatch.setattr(s3_module, "PART_BYTES", 5 << 20)
    monkeypatch.setattr(store_module, "SMALL_BYTES", 1 << 20)
    monkeypatch.setattr(store_module, "CHUNK_BYTES", 256 << 10)


def open_uploads(root: Root) -> list:
    storage = root.storage
    if not isinstance(storage, S3Storage):
        return []
    return storage.client.list_multipart_uploads(Bucket=storage.bucket).get("Uploads", [])


def test_a_large_file_streams_in_parts_and_comes_back_whole(root, tmp_path, small_parts, monkeypatch):
    data = random.Random(7).randbytes((12 << 20) + 12345)
    (tmp_path / "big.bin").write_bytes(data)
    parts = []
    if root.kind != "local":
        original = S3Storage._upload_part
        monkeypatch.setattr(
            S3Storage,
            "_upload_part",
            lambda self, key, upload, done, body: (parts.append(len(body)), original(self, key, upload, done, body)),
        )
    record = root.lake.push(tmp_path / "big.bin", what="backups", where="db_1", start=BASE, end=BASE + DAY).pushed[0]
    if root.kind != "local":
        assert parts == [5 << 20, 5 << 20, (2 << 20) + 12345], "three parts: two full, the rest"
    assert record["size"] == len(data) and record["hash"] == blake(data)
    assert root.storage.read(record["key"]).data == data
    root.lake.fetch(record["id"], str(tmp_path / "back.bin"))
    assert (tmp_path / "back.bin").read_bytes() == data
    assert open_uploads(root) == []
    again = root.lake.push(tmp_path / "big.bin", what="backups", where="db_1", start=BASE)
    assert again.pushed == [] and [r["id"] for r in again.duplicates] == [record["id"]]


def change_after_hashing(monkeypatch, how):
    """Change the file between the first reading (its hash) and the upload."""
    original = store_module._hash_of

    def hash_then_change(source):
        digest = original(source)
        how(source.path)
        return digest

    monkeypatch.setattr(store_module, "_hash_of", hash_then_change)


def flip_a_byte_keeping_size_and_mtime(path: Path) -> None:
    stat = path.stat()
    with open(path, "r+b") as handle:
        handle.seek(stat.st_size - 10)  # in the last part: every earlier part is already uploaded
        byte = handle.read(1)
        handle.seek(stat.st_size - 10)
        handle.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def append_bytes(path: Path) -> None:
    with open(path, "ab") as handle:
        handle.write(b"more")


@pytest.mark.parametrize("how", [flip_a_byte_keeping_size_and_mtime, append_bytes], ids=["content", "size"])
def test_a_file_that_changes_while_pushed_stores_nothing(root, tmp_path, small_parts, monkeypatch, how):
    (tmp_path / "big.bin").write_bytes(random.Random(3).randbytes(12 << 20))
    (tmp_path / "small.txt").write_bytes(b"a small file pushed with it")
    change_after_hashing(monkeypatch, how)
    lake = root.lake
    with pytest.raises(FileChanged, match="big.bin"):
        lake.push([tmp_path / "big.bin", tmp_path / "small.txt"], what="backups", where="db_1", work_id="run-1", start=BASE)
    assert [k for k in root.keys() if "/data/" in k and not k.endswith(blake_id(tmp_path / "small.txt"))] == [], (
        "no data of the changed file"
    )
    assert root.segments() == [], "nothing committed"
    assert lake.find_files("backups", start=BASE - DAY, end=BASE + DAY) == [] and lake.find_files("backups", work_id="run-1") == []
    assert lake.latest_file("backups") is None
    assert open_uploads(root) == [], "the multipart upload was aborted"
    if root.kind == "local":
        assert list(root.storage.leftovers("files/")) == [], "no temp file left"


def blake_id(path: Path) -> str:
    from singerlake.files.record import file_id

    return file_id("backups", "db_1", blake(path.read_bytes()))


def test_a_file_that_changes_while_pushed_is_one_error_line_from_the_cli(tmp_path, small_parts, monkeypatch, capsys):
    from singerlake.cli.main import main

    (tmp_path / "big.bin").write_bytes(random.Random(4).randbytes(3 << 20))
    change_after_hashing(monkeypatch, flip_a_byte_keeping_size_and_mtime)
    code = main(["push", str(tmp_path / "lake"), str(tmp_path / "big.bin"), "--what", "backups", "--where", "db_1"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "big.bin" in err and "changed" in err, err
    assert Root("local", str(tmp_path / "lake")).keys() == []


# -- 5. bad input: one line naming the field or file, exit 2, nothing visible ---------------------------
BAD_PUSHES = {
    "what upper case": (["--what", "Logs", "--where", "web"], "--what"),
    "what with a slash": (["--what", "a/b", "--where", "web"], "--what"),
    "what empty": (["--what", "", "--where", "web"], "--what"),
    "what too long": (["--what", "a" * 65, "--where", "web"], "--what"),
    "where with a space": (["--what", "logs", "--where", "web 02"], "--where"),
    "where with a dot": (["--what", "logs", "--where", ".."], "--where"),
    "work_id null": (["--what", "logs", "--where", "web", "--work-id", "null"], "--work-id"),
    "work_id unicode": (["--what", "logs", "--where", "web", "--work-id", "rün"], "--work-id"),
    "end before start": (["--what", "logs", "--where", "web", "--start", "2024-03-02", "--end", "2024-03-01"], "{file}"),
    "bad time": (["--what", "logs", "--where", "web", "--start", "soon"], "--start"),
    "no such date": (["--what", "logs", "--where", "web", "--start", "2024-02-30"], "--start"),
    "negative time": (["--what", "logs", "--where", "web", "--start", "-5"], "--start"),
}


ON_S3 = {"what upper case", "work_id null", "end before start", "missing among good ones", "unreadable file"}


def cases_on(cases) -> list:
    """Every case on a local lake; on S3 (where only "nothing visible" differs) a few."""
    return [
        pytest.param(kind, case, id=f"{kind}-{case}") for kind in BACKENDS for case in sorted(cases) if kind == "local" or case in ON_S3
    ]


@pytest.mark.parametrize("kind, case", cases_on(BAD_PUSHES))
def test_bad_push_input_is_one_line_and_exit_2(request, tmp_path, kind, case):
    root = root_on(request, kind, tmp_path)
    args, named = BAD_PUSHES[case]
    good = tmp_path / "good.txt"
    good.write_bytes(b"fine")
    result = root.cli("push", str(good), *args, check=False)
    assert_refused(root, result, named.format(file=good))


@pytest.mark.parametrize("kind, case", cases_on(["missing file", "unreadable file", "missing among good ones", "empty directory"]))
def test_bad_push_paths_are_one_line_and_exit_2(request, tmp_path, kind, case):
    root = root_on(request, kind, tmp_path)
    good = tmp_path / "good.txt"
    good.write_bytes(b"fine")
    bad = tmp_path / "bad.txt"
    if case == "unreadable file":
        if os.geteuid() == 0:  # root reads any regular file; nobody can open a socket
            bad = tmp_path / "bad.sock"
            sock = socket.socket(socket.AF_UNIX)
            sock.bind(str(bad))
        else:
            bad.write_bytes(b"secret")
            bad.chmod(0)
    if case == "empty directory":
        bad = tmp_path / "empty"
        bad.mkdir()
    paths = [str(good), str(bad)] if case == "missing among good ones" else [str(bad)]
    result = root.cli("push", *paths, "--what", "logs", "--where", "web", check=False)
    assert_refused(root, result, str(bad))


@pytest.mark.parametrize(
    "args, named",
    [
        (["--what", "Logs", "--start", "2024-01-01"], "--what"),
        (["--what", "logs", "--work-id", "null"], "--work-id"),
        (["--what", "logs", "--start", "2024-03-02", "--end", "2024-03-01"], "end"),
        (["--what", "logs"], "--start"),
        (["--what", "logs", "--latest", "--start", "2024-01-01"], "--latest"),
        (["--what", "logs", "--start", "soon"], "--start"),
    ],
)
def test_bad_queries_are_one_line_and_exit_2(tmp_path, args, named):
    root = Root("local", str(tmp_path / "lake"))
    (tmp_path / "a.txt").write_bytes(b"a")
    root.lake.push(tmp_path / "a.txt", what="logs", where="web", start=BASE)
    result = root.cli("files", *args, check=False)
    err = result.stderr.decode()
    assert result.returncode == 2 and len(err.strip().splitlines()) == 1 and named in err, err


# -- 6. pushes at once into one what --------------------------------------------------------------------
def make_files(directory: Path, count: int, tag: str, first_ms: int, step_ms: int) -> dict[str, bytes]:
    """``count`` small files, each with its own mtime (the default start), ``step_ms`` apart."""
    directory.mkdir(parents=True)
    files = {}
    for n in range(count):
        path = directory / f"{tag}-{n:05d}.txt"
        data = f"{tag} {n}\n".encode() * (1 + n % 7)
        path.write_bytes(data)
        mtime_ns = (first_ms + n * step_ms) * 1_000_000
        os.utime(path, ns=(mtime_ns, mtime_ns))
        files[str(path)] = data
    return files


@pytest.mark.heavy
@pytest.mark.parametrize("kind", ["local", "moto"])
def test_concurrent_pushes_into_one_what_lose_nothing(request, tmp_path, kind):
    root = root_on(request, kind, tmp_path)
    pushers, per_pusher = 4, 60
    files = {}
    runs = []
    for n in range(pushers):
        files.update(make_files(tmp_path / f"src{n}", per_pusher, f"p{n}", BASE + n * 3_600_000, 2 * 3_600_000))
        args = ["--what", "events", "--where", f"host{n}", "--work-id", f"run-{n}", "--end", iso(BASE + 6 * DAY), "--json"]
        runs.append(root.command("push", *([] if kind == "local" else cli_s3_args(root)), str(tmp_path / f"src{n}"), *args))
    env = cli_env(root)
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) for command in runs]
    outputs = [process.communicate() for process in processes]
    assert [p.returncode for p in processes] == [0] * pushers, [err.decode()[-2000:] for _, err in outputs]

    lake = root.lake
    found = lake.find_files("events", start=BASE, end=BASE + 6 * DAY)
    assert sorted(r["path"] for r in found) == sorted(files), "every file, once"
    for n in range(pushers):
        by_work = lake.find_files("events", work_id=f"run-{n}")
        assert sorted(r["path"] for r in by_work) == sorted(p for p in files if f"/src{n}/" in p)
    for day in range(6):
        on_day = {r["id"] for r in lake.find_files("events", start=BASE + day * DAY, end=BASE + (day + 1) * DAY - 1)}
        assert on_day == {r["id"] for r in found if r["start"] < BASE + (day + 1) * DAY}


# -- 7. kill -9 at any moment: nothing half visible ------------------------------------------------------
def check_nothing_half_visible(
    root: Root, files: dict[str, bytes], first_ms: int, end_ms: int, days: int, fetch_at_most: int
) -> list[dict]:
    lake = root.lake
    storage = root.storage
    visible = lake.find_files("batch", start=first_ms, end=end_ms)
    ids = [r["id"] for r in visible]
    assert len(set(ids)) == len(ids)
    by_work = {r["id"] for r in lake.find_files("batch", work_id="kill-run")}
    by_day = [{r["id"] for r in lake.find_files("batch", start=first_ms + d * DAY, end=first_ms + (d + 1) * DAY - 1)} for d in range(days)]
    for record in visible:
        assert record["path"] in files
        assert record["id"] in by_work, "found by its work id"
        for d in range((record["start"] - first_ms) // DAY, (record["end"] - first_ms) // DAY + 1):
            assert record["id"] in by_day[d], f"found on day {d} of its span"

    def fetched(record: dict) -> tuple[dict, bytes]:
        committed = lake.file_record(record["id"])  # fetchable: its record names a committed push
        copy = io.BytesIO()
        copy_verified(storage, committed, copy)
        return committed, copy.getvalue()

    # Fetched 8 at a time (each is a few S3 round trips), every one checked.
    sample = random.sample(visible, min(fetch_at_most, len(visible)))
    with ThreadPoolExecutor(8) as pool:
        for record, (committed, data) in zip(sample, pool.map(fetched, sample), strict=True):
            assert committed["key"] == record["key"]
            assert data == files[record["path"]]
    assert set().union(*by_day) <= set(ids) and by_work <= set(ids), "no query finds what the others miss"
    newest = lake.latest_file("batch")
    assert (newest["id"] if newest else None) in (expected_latest(visible, "batch", "") or {None}), "latest is a visible file"
    return visible


def committed_entries(root: Root) -> list[str]:
    """The ids in every committed segment: a file committed twice would be listed twice."""
    ids = []
    for key in root.segments():
        ids += [r["id"] for r in json.loads(gzip.decompress(root.storage.read(key).data))["records"]]
    return ids


SMALL_COMMITS_CLI = [
    sys.executable,
    "-c",
    "import sys; import singerlake.files.push as p; p.COMMIT_FILES = 100; "
    "from singerlake.cli.main import main; sys.exit(main(sys.argv[1:]))",
]


@pytest.mark.heavy
@pytest.mark.parametrize("kind", ["local", "moto"])
def test_a_push_killed_at_any_moment_leaves_nothing_half_visible(request, tmp_path, kind):
    root = root_on(request, kind, tmp_path)
    count = 3000 if kind == "local" else 400
    days = 10
    files = make_files(tmp_path / "src", count, "k", BASE + 3_600_000, (days - 2) * DAY // count)
    end_ms = BASE + days * DAY - 7_200_000  # every file spans from its mtime to here: many days, across midnights
    # The real CLI, committing every 100 files (not 10,000), so kills land between commits too.
    command = [*SMALL_COMMITS_CLI, "push", root.url, *([] if kind == "local" else cli_s3_args(root)), str(tmp_path / "src")]
    command += ["--what", "batch", "--where", "node-1", "--work-id", "kill-run", "--end", str(end_ms), "--json"]
    env = cli_env(root)
    rng = random.Random(int(os.environ.get("KILL_SEED", "22")))
    seen: list[int] = []
    for round_number in range(6):
        before = len(root.segments())
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        if round_number % 2:  # any moment: often before the first commit, while bytes and records are stored
            time.sleep(rng.uniform(0.2, 1.5))
        else:  # just after a commit, a little into the next chunk
            while len(root.segments()) == before and process.poll() is None:
                time.sleep(0.02)
            time.sleep(rng.uniform(0, 0.3))
        process.send_signal(signal.SIGKILL)
        process.wait()
        visible = check_nothing_half_visible(root, files, BASE, end_ms, days, count if kind == "local" else 40)
        seen.append(len(visible))
    print(f"files visible after each kill: {seen}")
    assert any(0 < n < count for n in seen), f"some kill landed halfway through the push: {seen}"
    final = subprocess.run(command, capture_output=True, env=env)
    assert final.returncode == 0, final.stderr.decode()[-2000:]
    visible = check_nothing_half_visible(root, files, BASE, end_ms, days, count)
    assert sorted(r["path"] for r in visible) == sorted(files), f"every file indexed after the rerun (seen after kills: {seen})"
    entries = committed_entries(root)
    assert sorted(entries) == sorted({r["id"] for r in visible}), "each file committed exactly once"


# -- latest weighs the long bucket against the newest day ---------------------------------------------
def push_one(lake: Lake, directory: Path, name: str, start: str, end: str | None, what: str = "scans") -> dict:
    path = directory / name
    path.write_bytes(name.encode())
    time.sleep(0.003)  # a later push has a later `created`
    return lake.push(path, what=what, where="web", start=start, end=end).pushed[0]


def test_latest_weighs_files_of_the_long_bucket_against_the_newest_day(tmp_path):
    lake = Root("local", str(tmp_path / "lake")).lake
    push_one(lake, tmp_path, "day.txt", "2024-03-05T08:00:00Z", "2024-03-05T10:00:00Z")
    long = push_one(lake, tmp_path, "long.txt", "2024-01-01T00:00:00Z", "2024-03-05T18:00:00Z")
    assert lake.latest_file("scans")["id"] == long["id"], "a long file ending after the newest day's files is the latest"
    later = push_one(lake, tmp_path, "later.txt", "2024-03-05T20:00:00Z", None)
    assert lake.latest_file("scans")["id"] == later["id"]


def test_latest_breaks_a_tie_at_the_last_ms_of_a_day_by_the_later_push(tmp_path):
    """A long file and an instant both at 23:59:59.999: the one pushed later is the latest (SPEC.md §14)."""
    lake = Root("local", str(tmp_path / "lake")).lake
    push_one(lake, tmp_path, "long.txt", "2024-01-01T00:00:00Z", "2024-03-05T23:59:59.999Z")
    instant = push_one(lake, tmp_path, "instant.txt", "2024-03-05T23:59:59.999Z", None)
    assert lake.latest_file("scans")["id"] == instant["id"]


def test_fetching_two_files_to_one_name_is_refused_before_writing(tmp_path):
    root = Root("local", str(tmp_path / "lake"))
    first = push_one(root.lake, tmp_path, "a.txt", "2024-03-05T08:00:00Z", None)
    second = push_one(root.lake, tmp_path, "b.txt", "2024-03-05T08:00:00Z", None)
    out = tmp_path / "out"
    result = root.cli("fetch", first["id"], second["id"], "--out", str(out), "--name", "{where}/{what}-{start_iso}", check=False)
    err = result.stderr.decode()
    assert result.returncode == 2 and len(err.strip().splitlines()) == 1 and "web/scans-2024-03-05T08:00:00.000Z" in err, err
    assert not out.exists() or not any(out.rglob("*")), "nothing fetched: one file would have overwritten the other"


def test_push_times_now_seconds_ms_and_the_default_mtime(tmp_path):
    root = Root("local", str(tmp_path / "lake"))
    path = tmp_path / "a.txt"
    path.write_bytes(b"a")
    mtime_ms = BASE + 12_345
    os.utime(path, ns=(mtime_ms * 1_000_000, mtime_ms * 1_000_000))
    pushed = root.cli_json("push", str(path), "--what", "t", "--where", "w")["pushed"][0]
    assert (pushed["start"], pushed["end"], pushed["end_iso"]) == (mtime_ms, None, None), "no --start: the file's mtime, an instant"
    for typed, expected in (("99999999999", 99_999_999_999_000), ("100000000001", 100_000_000_001), ("1709251200.5", BASE + 500)):
        path.write_bytes(typed.encode())  # new bytes, so a new file
        pushed = root.cli_json("push", str(path), "--what", "t", "--where", "w", "--start", typed)["pushed"][0]
        assert pushed["start"] == expected, typed
    path.write_bytes(b"now")
    before = int(time.time() * 1000)
    pushed = root.cli_json("push", str(path), "--what", "t", "--where", "w", "--start", "2024-01-01", "--end", "now")["pushed"][0]
    assert before <= pushed["end"] <= int(time.time() * 1000) and pushed["start_iso"] == "2024-01-01T00:00:00.000Z"


def test_a_file_found_by_a_query_stays_fetchable_when_a_racing_push_of_its_bytes_died(tmp_path):
    """Two pushes of the same bytes at once: P2 finds the data stored but P1's push not yet committed, so
    it writes its own record (txn2) over P1's; P1 commits, P2 is killed before its segment. The file is
    in the index (P1's segment) but its record names txn2, which never committed."""
    root = Root("local", str(tmp_path / "lake"))
    (tmp_path / "a.txt").write_bytes(b"pushed twice at once")
    record = root.lake.push(tmp_path / "a.txt", what="logs", where="web", start=BASE).pushed[0]
    key = f"files/ids/{record['id'][:2]}/{record['id']}.json"
    root.storage.write(key, json.dumps({**record, "txn": "f" * 32}).encode())  # what P2 left behind
    assert [r["id"] for r in root.lake.find_files("logs", start=BASE, end=BASE)] == [record["id"]]
    fetched = root.cli("fetch", record["id"], "--out", "-", check=False)
    assert fetched.returncode == 0 and fetched.stdout == b"pushed twice at once"
    assert root.lake.file_record(record["id"]) == record, "the committed record, from its segment"
    (tmp_path / "b.txt").write_bytes(b"never committed")
    never = root.lake.push(tmp_path / "b.txt", what="logs", where="web", start=BASE).pushed[0]
    root.storage.delete(f"files/index/logs/segments/{never['txn']}.json.gz")  # as if killed just before its commit
    assert root.cli("fetch", never["id"], "--out", "-", check=False).returncode == 2, "a file never committed is still not fetchable"
