"""Both storage backends honour the same contract: atomic conditional writes, listings, clear errors."""

from __future__ import annotations

import io
import os
import pickle
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from singerlake import Lake, SchemaWriter
from singerlake.storage import (
    Blob,
    LocalStorage,
    NotFound,
    PreconditionFailed,
    S3Storage,
    StorageError,
    open_storage,
)

SECRET = "testing-secret"  # the secret key s3_servers gives both S3 servers


def test_read_write_delete_round_trip(storage):
    data = bytes(range(256)) * 3 + "ü名🦄".encode()
    etag = storage.write("raw/t/s/obj.bin", data)
    blob = storage.read("raw/t/s/obj.bin")
    assert blob.data == data
    assert blob.etag == etag
    assert storage.read_etag("raw/t/s/obj.bin") == etag
    assert storage.exists("raw/t/s/obj.bin")

    storage.write("raw/t/s/obj.bin", b"")  # unconditional overwrite, to an empty object
    assert storage.read("raw/t/s/obj.bin").data == b""

    storage.delete("raw/t/s/obj.bin")
    assert not storage.exists("raw/t/s/obj.bin")
    with pytest.raises(NotFound):
        storage.read("raw/t/s/obj.bin")
    storage.delete("raw/t/s/obj.bin")  # deleting what is gone is fine
    storage.delete("raw/never/was")


def test_read_of_missing_names_the_key(storage):
    with pytest.raises(NotFound) as info:
        storage.read("raw/tap/missing.json")
    assert "raw/tap/missing.json" in str(info.value)
    assert storage.url_of("raw/tap/missing.json") in str(info.value)
    with pytest.raises(NotFound, match="raw/tap/missing.json"):
        storage.open_read("raw/tap/missing.json")
    with pytest.raises(NotFound, match="raw/tap/missing.json"):
        storage.read_etag("raw/tap/missing.json")
    assert isinstance(info.value, StorageError)


def test_create_only_write_never_overwrites(storage):
    storage.write("k/lock", b"first", if_none_match=True)
    with pytest.raises(PreconditionFailed) as info:
        storage.write("k/lock", b"second", if_none_match=True)
    assert "k/lock" in str(info.value)
    assert storage.read("k/lock").data == b"first"


def test_if_match_replaces_only_the_expected_version(storage):
    old = storage.write("k/manifest.json", b"v1", if_none_match=True)
    current = storage.write("k/manifest.json", b"v2", if_match=old)
    assert current != old
    assert storage.read("k/manifest.json").etag == current
    assert storage.read("k/manifest.json").data == b"v2"

    with pytest.raises(PreconditionFailed):
        storage.write("k/manifest.json", b"stale", if_match=old)
    assert storage.read("k/manifest.json").data == b"v2"

    newer = storage.write("k/manifest.json", b"v3", if_match=current)
    blob = storage.read("k/manifest.json")
    assert (blob.data, blob.etag) == (b"v3", newer)


def test_if_match_on_a_missing_object_fails(storage):
    etag = storage.write("k/gone", b"x")
    storage.delete("k/gone")
    with pytest.raises(PreconditionFailed):
        storage.write("k/gone", b"y", if_match=etag)
    assert not storage.exists("k/gone")


def test_conditional_delete(storage):
    old = storage.write("k/lock", b"mine")
    current = storage.write("k/lock", b"taken over", if_match=old)
    with pytest.raises(PreconditionFailed):
        storage.delete("k/lock", if_match=old)
    assert storage.read("k/lock").data == b"taken over"
    storage.delete("k/lock", if_match=current)
    assert not storage.exists("k/lock")
    with pytest.raises(PreconditionFailed):
        storage.delete("k/lock", if_match=current)


# -- races: exactly one of 8 writers wins each conditional operation ---------------------------------
ROUNDS = 3  # a fresh race on a fresh object each round: one lucky ordering proves nothing


def _racers(storage, count: int = 8) -> list:
    """Copies of ``storage``, each with a client of its own (as separate processes have), connected."""
    racers = [pickle.loads(pickle.dumps(storage)) for _ in range(count)]
    for racer in racers:
        racer.exists("warm-up")  # no one starts ahead by a connection
    return racers


def _race(racers: list, attempt) -> list[object]:
    """``attempt(racer, i)`` for each racer in a thread of its own, all released at once.

    Returns each attempt's result, or the PreconditionFailed it raised (any other error fails).
    """
    start = threading.Barrier(len(racers))

    def run(i: int):
        start.wait()
        try:
            return attempt(racers[i], i)
        except PreconditionFailed as lost:
            return lost

    with ThreadPoolExecutor(len(racers)) as pool:
        return list(pool.map(run, range(len(racers))))


def _the_winner(outcomes: list[object]) -> int:
    winners = [i for i, outcome in enumerate(outcomes) if not isinstance(outcome, PreconditionFailed)]
    assert len(winners) == 1, outcomes
    return winners[0]


def test_eight_creators_race_and_exactly_one_wins(storage):
    """Create-only (If-None-Match: *): how a data file, a lock or a first manifest comes to be."""
    racers = _racers(storage)
    for round_ in range(ROUNDS):
        key = f"raw/t/s/race-{round_}/singerlake.lock"
        outcomes = _race(racers, lambda s, i, key=key: s.write(key, f"writer {i}".encode(), if_none_match=True))
        winner = _the_winner(outcomes)
        assert storage.read(key) == Blob(f"writer {winner}".encode(), outcomes[winner])


def test_eight_replacers_of_one_version_race_and_exactly_one_wins(storage):
    """If-Match: how a manifest commit or a lock takeover replaces exactly the version it read."""
    racers = _racers(storage)
    for round_ in range(ROUNDS):
        key = f"raw/t/s/race-{round_}/manifest.json"
        seen = storage.write(key, b"version 0", if_none_match=True)
        outcomes = _race(racers, lambda s, i, key=key, seen=seen: s.write(key, f"writer {i}".encode(), if_match=seen))
        winner = _the_winner(outcomes)
        assert storage.read(key) == Blob(f"writer {winner}".encode(), outcomes[winner])


def _release_or_take_over(storage, i: int, key: str, seen: str):
    """Racers 0 and 1 release the lock version ``seen`` (a delete If-Match); the others take it over."""
    if i < 2:
        return storage.delete(key, if_match=seen)
    return storage.write(key, f"taker {i}".encode(), if_match=seen)


def test_release_and_takeovers_of_one_version_race_and_exactly_one_wins(storage):
    racers = _racers(storage)
    for round_ in range(ROUNDS):
        key = f"raw/t/s/race-{round_}/singerlake.lock"
        seen = storage.write(key, b"holder", if_none_match=True)
        outcomes = _race(racers, lambda s, i, key=key, seen=seen: _release_or_take_over(s, i, key, seen))
        winner = _the_winner(outcomes)
        if winner < 2:
            assert not storage.exists(key)
        else:
            assert storage.read(key) == Blob(f"taker {winner}".encode(), outcomes[winner])


KEYS = [
    "raw/a/x-1",
    "raw/a/x.1",
    "raw/a/x/1",
    "raw/a/x_1",
    "raw/a/y/deep/er/file",
    "raw/ab/z",
    "raw/b/c",
    "raw/singerlake.json",
    "top.json",
]


def test_list_is_in_key_order_and_filters_by_prefix(storage):
    for key in reversed(KEYS):
        storage.write(key, key.encode())
    listed = list(storage.list(""))
    assert [info.key for info in listed] == sorted(KEYS)
    assert {info.key: info.size for info in listed} == {k: len(k) for k in KEYS}
    assert all(info.mtime > 0 for info in listed)

    assert [i.key for i in storage.list("raw/")] == sorted(k for k in KEYS if k.startswith("raw/"))
    assert [i.key for i in storage.list("raw/a/")] == ["raw/a/x-1", "raw/a/x.1", "raw/a/x/1", "raw/a/x_1", "raw/a/y/deep/er/file"]
    assert [i.key for i in storage.list("raw/a")] == [k for k in sorted(KEYS) if k.startswith("raw/a")]
    assert [i.key for i in storage.list("raw/a/x")] == ["raw/a/x-1", "raw/a/x.1", "raw/a/x/1", "raw/a/x_1"]
    assert [i.key for i in storage.list("raw/a/x/")] == ["raw/a/x/1"]
    assert [i.key for i in storage.list("raw/nothing/")] == []
    assert [i.key for i in storage.list("nothing")] == []


def test_list_starts_after_a_key(storage):
    """A log's newest entries are listed from a key on (SPEC.md §12): only keys after it, in order."""
    keys = [f"t/_delta_log/{version:020d}.json" for version in range(12)] + ["t/_delta_log/00000000000000000005.checkpoint.parquet"]
    for key in keys:
        storage.write(key, b"{}")
    after = [info.key for info in storage.list("t/_delta_log/", start_after="t/_delta_log/00000000000000000005")]
    assert after == sorted(key for key in keys if key > "t/_delta_log/00000000000000000005")
    assert after[:2] == ["t/_delta_log/00000000000000000005.checkpoint.parquet", "t/_delta_log/00000000000000000005.json"]
    assert [info.key for info in storage.list("t/_delta_log/", start_after="t/_delta_log/00000000000000000011.json")] == []


def test_list_spans_pages_in_key_order(storage):
    """More keys than one S3 page (1,000) with a "directory" among its sibling keys: each key once, in order."""
    keys = [f"raw/t/s/x/{i:04d}" for i in range(1010)] + ["raw/t/s/x-1", "raw/t/s/x.1", "raw/t/s/x_1", "raw/t/s/w"]
    with ThreadPoolExecutor(storage.parallel_requests) as pool:
        list(pool.map(lambda key: storage.write(key, b"x"), keys))
    assert [info.key for info in storage.list("raw/t/s/")] == sorted(keys)
    assert storage.list_dirs("raw/t/s/") == ["x"]


def test_list_dirs(storage):
    for key in KEYS:
        storage.write(key, b"x")
    assert storage.list_dirs("") == ["raw"]
    assert storage.list_dirs("raw/") == ["a", "ab", "b"]
    assert storage.list_dirs("raw/a/") == ["x", "y"]
    assert storage.list_dirs("raw/a/y/") == ["deep"]
    assert storage.list_dirs("raw/b/") == []
    assert storage.list_dirs("raw/none/") == []


def test_open_read_streams(storage):
    data = os.urandom(3 * 1024 * 1024 + 17)
    storage.write("raw/big.bin", data)
    chunks = []
    with storage.open_read("raw/big.bin") as handle:
        while chunk := handle.read(256 * 1024):
            assert len(chunk) <= 256 * 1024
            chunks.append(chunk)
    assert len(chunks) > 1
    assert b"".join(chunks) == data


def test_check_writable_passes_and_leaves_nothing(storage):
    storage.check_writable()
    assert list(storage.list("")) == []


def test_open_storage_local_forms(tmp_path):
    target = tmp_path / "lake dir ü"
    for root in (str(target), f"file://{target}", f"file://localhost{target}", "file://" + str(target).replace(" ", "%20")):
        storage = open_storage(root)
        assert isinstance(storage, LocalStorage)
        assert Path(storage.root) == target
    storage = open_storage(str(target))
    storage.check_writable()
    storage.write("raw/x", b"1")
    assert (target / "raw" / "x").read_bytes() == b"1"
    assert open_storage(f"file://{target}").read("raw/x").data == b"1"


def test_open_storage_relative_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    storage = open_storage("rel/lake")
    storage.write("raw/x", b"1")
    assert (tmp_path / "rel" / "lake" / "raw" / "x").read_bytes() == b"1"
    assert isinstance(open_storage(None), LocalStorage)


@pytest.mark.parametrize("root", ["http://example.com/lake", "gs://bucket/lake", "file://otherhost/lake"])
def test_open_storage_refuses_unsupported_roots(root):
    with pytest.raises(StorageError, match="lake"):
        open_storage(root)


def test_open_storage_refuses_unknown_options(tmp_path):
    with pytest.raises(StorageError, match="bogus"):
        open_storage(str(tmp_path), bogus=1)


def test_open_storage_s3(s3_root):
    url, options = s3_root
    storage = open_storage(url, **options)
    assert isinstance(storage, S3Storage)
    storage.check_writable()
    storage.write("raw/x", b"1")
    assert open_storage(url + "/", **options).read("raw/x").data == b"1"


def test_s3_read_whose_body_fails_its_checksum_is_made_again(s3_root):
    """A body torn in transit (a real server's response, checked by botocore against a checksum it does
    not match) is read again, and a read that keeps failing names the key."""
    from botocore.httpchecksum import Crc32Checksum, StreamingChecksumBody

    url, options = s3_root
    storage = open_storage(url, **options)
    storage.write("raw/x", b"the bytes")
    real_get, torn = storage.client.get_object, [2]

    def get_object(**kwargs):
        response = real_get(**kwargs)
        if torn[0]:
            torn[0] -= 1
            data = response["Body"].read()
            response["Body"] = StreamingChecksumBody(io.BytesIO(data[:-1]), len(data) - 1, Crc32Checksum(), "AAAAAA==")
        return response

    storage.client.get_object = get_object
    assert storage.read("raw/x").data == b"the bytes"  # two torn bodies, then the whole one
    torn[0] = 3
    with pytest.raises(StorageError, match=r"raw/x failed: FlexibleChecksumError"):
        storage.read("raw/x")


def test_s3_missing_bucket_names_the_bucket_and_hides_the_secret(s3_root):
    _, options = s3_root
    assert options["secret_access_key"] == SECRET
    storage = S3Storage("s3://no-such-bucket-here/lake", **options)
    with pytest.raises(StorageError) as info:
        storage.check_writable()
    assert "no-such-bucket-here" in str(info.value)
    assert SECRET not in str(info.value)
    with pytest.raises(StorageError) as info:
        storage.write("raw/x", b"1")
    assert SECRET not in str(info.value)


def test_s3_never_shows_the_secret(s3_root):
    url, options = s3_root
    storage = open_storage(url, **options)
    for text in (repr(storage), str(storage), storage.url, storage.url_of("raw/x")):
        assert SECRET not in text
    errors = []
    for action in (lambda: storage.read("raw/missing"), lambda: storage.write("raw/x", b"1", if_match='"stale"')):
        with pytest.raises(StorageError) as info:
            action()
        errors.append(info.value)
    wrong = S3Storage(url, **{**options, "secret_access_key": "wrong-" + SECRET})
    wrong_key = S3Storage(url, **{**options, "access_key_id": "AKIAUNKNOWN"})
    for other in (wrong, wrong_key):
        try:
            other.read("raw/x")
        except StorageError as exc:
            errors.append(exc)
    for exc in errors:
        assert SECRET not in str(exc) and SECRET not in repr(exc)
    # Shipping a storage to Spark executors keeps it usable.
    clone = pickle.loads(pickle.dumps(storage))
    clone.write("raw/y", b"2")
    assert storage.read("raw/y").data == b"2"


def test_lake_over_a_missing_s3_bucket_fails_clearly(s3_root):
    """A missing bucket is a broken lake root, never a missing object (which readers treat as empty)."""
    storage = S3Storage("s3://absent-bucket-xyz/lake", **s3_root[1])
    lake = Lake(storage)
    message = {"type": "SCHEMA", "stream": "s", "schema": {"type": "object"}}
    attempts = [
        lambda: SchemaWriter(lake, "tap", message, wait_s=1).open(),
        lambda: lake.taps(),
        lambda: lake.manifest("tap", "s"),
        lambda: storage.read("raw/singerlake.json"),
    ]
    for attempt in attempts:
        with pytest.raises(StorageError) as info:
            attempt()
        assert not isinstance(info.value, NotFound), info.value
        assert "bucket 'absent-bucket-xyz'" in str(info.value)
        assert SECRET not in str(info.value)


def _unwritable_root(tmp_path: Path) -> Path:
    """A root no process may create files in: mode 500 normally; as root, a path below a plain file."""
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    probe = locked / "probe"
    try:
        probe.write_bytes(b"")
    except PermissionError:
        return locked / "lake"
    probe.unlink()  # running as root: permissions do not stop us
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"not a directory")
    return blocker / "lake"


def test_unwritable_local_root_raises_storage_error(tmp_path):
    root = _unwritable_root(tmp_path)
    try:
        storage = open_storage(str(root))
        with pytest.raises(StorageError) as info:
            storage.check_writable()
        assert str(root) in str(info.value)
        with pytest.raises(StorageError) as info:
            storage.write("raw/x", b"1")
        assert "raw/x" in str(info.value)
        assert not root.exists()
    finally:
        (tmp_path / "locked").chmod(stat.S_IRWXU)


def test_s3_small_writes_go_in_one_round_trip_large_ones_wait_for_100_continue(s3_root):
    """botocore would send every PUT with ``Expect: 100-continue`` (a round trip before the body);
    locks, manifests and small files go without it, bodies of 1 MiB and more keep it."""
    from singerlake.storage.s3 import EXPECT_MIN_BYTES

    url, options = s3_root
    storage = open_storage(url, **options)
    sent: list[bool] = []
    events = storage.client.meta.events  # the process's shared client: the listener goes again at the end
    events.register("before-send.s3.PutObject", lambda request, **_: sent.append("Expect" in request.headers), unique_id="expect-seen")
    small, large = b"s" * 3000, b"l" * EXPECT_MIN_BYTES
    try:
        storage.write("raw/small", small, if_none_match=True)
        storage.write("raw/large", large, if_none_match=True)
    finally:
        events.unregister("before-send.s3.PutObject", unique_id="expect-seen")
    assert sent == [False, True]
    assert storage.read("raw/small").data == small and storage.read("raw/large").data == large


def test_local_create_only_writes_leave_no_temp_name_and_sync_keeps_them(tmp_path):
    """Create-only writes go through an unnamed file (O_TMPFILE on Linux), or a named temp file where the
    filesystem refuses it: either way the object appears whole, and the directory holds nothing else."""
    for unnamed in (True, False):
        storage = LocalStorage(tmp_path / f"lake-{unnamed}")
        storage._tmpfile = unnamed and hasattr(os, "O_TMPFILE")
        storage.write("a/b/c", b"bytes", if_none_match=True, durable=False)
        with pytest.raises(PreconditionFailed):
            storage.write("a/b/c", b"other", if_none_match=True)
        storage.sync(["a/b/c"])
        assert storage.read("a/b/c").data == b"bytes"
        assert os.listdir(storage.root / "a" / "b") == ["c"]
        assert stat.S_IMODE(os.stat(storage.root / "a" / "b" / "c").st_mode) == 0o666 & ~_umask()


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
