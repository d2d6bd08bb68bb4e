"""The tests' own tools, checked: the counting storage (support/storage.py) counts every ``Storage`` method,
once, under the kind of request it makes, and passes the call on to the same method of the storage it wraps."""

from __future__ import annotations

import inspect
import pickle
import uuid

import pytest
from singerlake.storage import S3Storage, Storage
from support.storage import DELETE, GET, HEAD, KINDS, LIST, NOT_COUNTED, PUT, Counting


def storage_methods() -> list[str]:
    return sorted(name for name, value in inspect.getmembers(Storage) if callable(value) and not name.startswith("_"))


# A value for each parameter a Storage method takes (by name); a method with another parameter fails here, to be added.
VALUES = {
    "key": "some/key",
    "prefix": "some/",
    "data": b"bytes",
    "chunks": [b"by", b"tes"],
    "cutoff_ms": 0,
    "start_after": "some/a",
    "keys": ["some/key"],
}


def call_args(name: str) -> tuple:
    parameters = list(inspect.signature(getattr(Storage, name)).parameters.values())[1:]
    missing = [p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD and p.name not in VALUES]
    assert not missing, f"Storage.{name} takes {missing}: give tests/test_support.py a value for them"
    return tuple(VALUES[p.name] for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD)


def recorder() -> Storage:
    """A storage whose every method records its call and answers a token naming the method."""
    got: list[tuple[str, tuple]] = []

    def method(name: str):
        def answer(self, *args, **kwargs):
            got.append((name, args))
            return f"answer of {name}"

        return answer

    cls = type("Recorder", (Storage,), {name: method(name) for name in storage_methods()})
    storage = cls()
    storage.url, storage.got = "mem://recorder", got
    return storage


@pytest.mark.parametrize("name", storage_methods())
def test_every_storage_method_is_counted_once_under_its_kind_and_passed_on_to_the_same_method(name):
    assert name in KINDS or name in NOT_COUNTED, f"Storage.{name} has no kind in support/storage.py"
    assert name in vars(Counting), f"Counting inherits Storage.{name}: the wrapped storage's own {name} would not run"
    inner = recorder()
    counting = Counting(inner)
    args = call_args(name)
    assert getattr(counting, name)(*args) == f"answer of {name}"
    assert inner.got == [(name, args)], "the call reaches the same method of the wrapped storage, with the same arguments"
    if name in NOT_COUNTED:
        assert counting.calls == [] and counting.kinds() == {}
    else:
        assert counting.calls == [(name, args[0] if args and isinstance(args[0], str) else "")]
        assert counting.kinds() == {KINDS[name]: 1}


# What each S3 operation is, as a request: the kind the counting storage must give the method that sent it.
S3_KINDS = {
    "GetObject": GET,
    "HeadObject": HEAD,
    "HeadBucket": HEAD,
    "PutObject": PUT,
    "CreateMultipartUpload": PUT,
    "UploadPart": PUT,
    "CompleteMultipartUpload": PUT,
    "DeleteObject": DELETE,
    "AbortMultipartUpload": DELETE,
    "ListObjectsV2": LIST,
}
ALSO_SENDS = {"open_read": {HEAD}}  # S3Storage.open_read heads the key first, for a clear NotFound before streaming
SENDS_A_REQUEST = ("read", "open_read", "read_etag", "exists", "root_exists", "write", "write_stream", "delete", "list", "list_dirs")


def test_each_kind_is_the_request_the_method_sends_to_s3(moto_server):
    """On moto over HTTP: the operations each call sends are of the kind it is counted under (``exists``: one HEAD, no GET)."""
    bucket = f"count-{uuid.uuid4().hex[:12]}"
    s3 = S3Storage(f"s3://{bucket}/root", **moto_server.options())
    s3.client.create_bucket(Bucket=bucket)
    sent: list[str] = []

    def seen(model, **_) -> None:
        sent.append(model.name)

    s3.client.meta.events.register("before-call.s3", seen)
    try:
        check_kinds(Counting(s3), s3, sent)
    finally:
        s3.client.meta.events.unregister("before-call.s3", seen)


def check_kinds(counting: Counting, s3: S3Storage, sent: list[str]) -> None:
    s3.write("some/key", b"bytes")
    for name in storage_methods():
        if KINDS.get(name) in (None, "CHECK", "SYNC"):
            continue
        sent.clear()
        result = getattr(counting, name)(*call_args(name))
        if name in ("list", "list_dirs", "leftovers", "stale_leftovers"):
            list(result)  # a listing's requests go out as it is read
        elif name == "open_read":
            result.close()
        kinds = {S3_KINDS[operation] for operation in sent}
        assert kinds <= {KINDS[name], *ALSO_SENDS.get(name, ())}, f"{name} sent {sent}, counted as {KINDS[name]}"
        assert KINDS[name] in kinds or name not in SENDS_A_REQUEST, f"{name} sent {sent}, counted as {KINDS[name]}"
        if name == "delete":
            s3.write("some/key", b"bytes")
    sent.clear()
    assert counting.exists("missing/key") is False and sent == ["HeadObject"] and counting.calls[-1] == ("exists", "missing/key")


def test_pickled_it_is_the_wrapped_storage(tmp_path):
    """Spark executors get the plain storage: only the driver's calls are counted."""
    from singerlake.storage import LocalStorage

    counting = Counting(LocalStorage(tmp_path))
    counting.write("a", b"1")
    copied = pickle.loads(pickle.dumps(counting))
    assert type(copied) is LocalStorage and copied.read("a").data == b"1"
    assert counting.calls == [("write", "a")] and counting.requests == [("write", "a")]
    counting.sync(["a"])
    assert counting.kinds() == {PUT: 1, "SYNC": 1} and counting.requests == [("write", "a")]
