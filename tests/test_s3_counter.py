"""The counting S3 proxy (support/s3_counter.py), on moto and SeaweedFS: every request forwarded as sent and
answered as the server answered (SigV4 still verifies), each counted once under its kind and operation with
its key, status and bytes; boto3, delta-rs and pyiceberg's pyarrow FileIO all work through it."""

from __future__ import annotations

import http.client
import io
import os
import re
import threading
from urllib.parse import urlsplit

import boto3
import pyarrow as pa
import pytest
from botocore.exceptions import ClientError
from support.s3_counter import DELETE, GET, HEAD, LIST, POST, PUT, S3Counter, classify

VOLATILE = {"date", "x-amz-request-id", "x-amzn-requestid", "x-amz-id-2", "last-modified"}  # differ between two identical requests


def client(root, endpoint: str | None = None):
    options = root.options
    return boto3.client(
        "s3",
        endpoint_url=endpoint or options["endpoint_url"],
        aws_access_key_id=options["access_key_id"],
        aws_secret_access_key=options["secret_access_key"],
        region_name=options["region"],
    )


def only(tally, kind: str, op: str, key: str, status: int):
    """The tally's one request, checked."""
    assert len(tally) == 1, tally.requests
    request = tally.requests[0]
    assert (request.kind, request.op, request.key, request.status) == (kind, op, key, status), request
    return request


def test_each_boto3_request_is_counted_under_its_kind_with_its_key(counted_s3_root):
    root, s3 = counted_s3_root, client(counted_s3_root)
    bucket, counter = root.bucket, root.counter
    with counter.counting() as tally:
        s3.put_object(Bucket=bucket, Key="dir/a b.txt", Body=b"hello")
    assert only(tally, PUT, "PutObject", "dir/a b.txt", 200).bytes_in == 5
    with counter.counting() as tally:
        assert s3.get_object(Bucket=bucket, Key="dir/a b.txt")["Body"].read() == b"hello"
    assert only(tally, GET, "GetObject", "dir/a b.txt", 200).bytes_out == 5
    with counter.counting() as tally:
        s3.head_object(Bucket=bucket, Key="dir/a b.txt")
    only(tally, HEAD, "HeadObject", "dir/a b.txt", 200)
    with counter.counting() as tally, pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="missing")
    only(tally, HEAD, "HeadObject", "missing", 404)
    with counter.counting() as tally:
        s3.head_bucket(Bucket=bucket)
    only(tally, HEAD, "HeadBucket", "", 200)
    with counter.counting() as tally:
        assert [item["Key"] for item in s3.list_objects_v2(Bucket=bucket, Prefix="dir/")["Contents"]] == ["dir/a b.txt"]
    assert only(tally, LIST, "ListObjectsV2", "dir/", 200).bytes_out > 0
    with counter.counting() as tally:
        s3.list_objects(Bucket=bucket)
    only(tally, LIST, "ListObjects", "", 200)
    with counter.counting() as tally:
        s3.delete_object(Bucket=bucket, Key="dir/a b.txt")
    only(tally, DELETE, "DeleteObject", "dir/a b.txt", 204)
    assert counter.since().kinds == {PUT: 1, GET: 1, HEAD: 3, LIST: 2, DELETE: 1}


def test_a_conditional_put_is_a_put_and_its_412_is_passed_on(counted_s3_root):
    root, s3 = counted_s3_root, client(counted_s3_root)
    with root.counter.counting() as tally:
        s3.put_object(Bucket=root.bucket, Key="lock", Body=b"1", IfNoneMatch="*")
        with pytest.raises(ClientError) as lost:
            s3.put_object(Bucket=root.bucket, Key="lock", Body=b"2", IfNoneMatch="*")
    assert lost.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert [(r.kind, r.key, r.status, r.condition) for r in tally.requests] == [
        (PUT, "lock", 200, "If-None-Match: *"),
        (PUT, "lock", 412, "If-None-Match: *"),
    ]
    assert s3.get_object(Bucket=root.bucket, Key="lock")["Body"].read() == b"1"


def test_a_batch_delete_is_one_delete_naming_its_keys(counted_s3_root):
    root, s3 = counted_s3_root, client(counted_s3_root)
    for key in ("a", "b", "c"):
        s3.put_object(Bucket=root.bucket, Key=key, Body=b"x")
    with root.counter.counting() as tally:
        s3.delete_objects(Bucket=root.bucket, Delete={"Objects": [{"Key": "a"}, {"Key": "b"}, {"Key": "c"}]})
    assert only(tally, DELETE, "DeleteObjects", "", 200).deleted == 3


def test_a_multipart_upload_is_counted_part_by_part(counted_s3_root):
    root, s3 = counted_s3_root, client(counted_s3_root)
    parts = [os.urandom(5 * 2**20), os.urandom(1000)]  # every part but the last at least 5 MiB
    with root.counter.counting() as tally:
        upload = s3.create_multipart_upload(Bucket=root.bucket, Key="big")["UploadId"]
        etags = [
            s3.upload_part(Bucket=root.bucket, Key="big", UploadId=upload, PartNumber=n, Body=part)["ETag"]
            for n, part in enumerate(parts, 1)
        ]
        done = {"Parts": [{"PartNumber": n, "ETag": etag} for n, etag in enumerate(etags, 1)]}
        s3.complete_multipart_upload(Bucket=root.bucket, Key="big", UploadId=upload, MultipartUpload=done)
    assert [r.op for r in tally.requests] == ["CreateMultipartUpload", "UploadPart", "UploadPart", "CompleteMultipartUpload"]
    assert tally.kinds == {POST: 2, PUT: 2} and set(tally.keys()) == {"big"}
    assert [r.bytes_in for r in tally.of("UploadPart")] == [len(part) for part in parts]
    with root.counter.counting() as tally:
        assert s3.get_object(Bucket=root.bucket, Key="big")["Body"].read() == b"".join(parts)
    assert tally.bytes_out == sum(map(len, parts)) and tally.bytes_in == 0


def test_a_chunked_body_is_forwarded_and_its_data_counted(counted_s3_root):
    root, s3 = counted_s3_root, client(counted_s3_root)
    url = urlsplit(s3.generate_presigned_url("put_object", Params={"Bucket": root.bucket, "Key": "chunked"}, ExpiresIn=300))
    chunks = [b"abc", os.urandom(100_000), b"z"]
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    with root.counter.counting() as tally:
        connection.request("PUT", f"{url.path}?{url.query}", body=iter(chunks), encode_chunked=True)
        response = connection.getresponse()
        response.read()
    connection.close()
    assert response.status == 200
    assert only(tally, PUT, "PutObject", "chunked", 200).bytes_in == sum(map(len, chunks))
    assert s3.get_object(Bucket=root.bucket, Key="chunked")["Body"].read() == b"".join(chunks)


def answer(s3, bucket: str, key: str, headers: dict) -> tuple[int, dict, bytes]:
    """A presigned GET of ``key`` sent with ``headers`` (to the endpoint ``s3`` has): status, headers and body, but
    what differs between two identical requests (dates, request ids)."""
    url = urlsplit(s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=300))
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        connection.request("GET", f"{url.path}?{url.query}", headers=headers)
        response = connection.getresponse()
        body = re.sub(rb"<(RequestId|HostId)>[^<]*</\1>", b"", response.read())  # an error's ids differ per request
        stable = {name.lower(): value for name, value in response.getheaders() if name.lower() not in VOLATILE}
        return response.status, stable, body
    finally:
        connection.close()


def test_responses_come_back_as_the_server_sent_them(counted_s3_root):
    """200, 304 and 404 through the proxy: the same status, headers and body as straight from the server."""
    root = counted_s3_root
    through, direct = client(root), client(root, root.counter.upstream)
    etag = through.put_object(Bucket=root.bucket, Key="k", Body=b"some bytes")["ETag"]
    cases = [("k", {}), ("k", {"If-None-Match": etag}), ("missing", {})]
    with root.counter.counting() as tally:
        answers = [answer(through, root.bucket, key, headers) for key, headers in cases]
    assert [status for status, _, _ in answers] == [200, 304, 404] == [r.status for r in tally.requests]
    assert answers == [answer(direct, root.bucket, key, headers) for key, headers in cases]
    assert tally.requests[1].condition == f"If-None-Match: {etag}"


def test_a_delta_table_round_trip_through_the_proxy(counted_s3_root):
    from deltalake import DeltaTable, write_deltalake

    root = counted_s3_root
    options = {
        "AWS_ENDPOINT_URL": root.options["endpoint_url"],
        "AWS_ACCESS_KEY_ID": root.options["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": root.options["secret_access_key"],
        "AWS_REGION": root.options["region"],
        "AWS_ALLOW_HTTP": "true",
    }
    uri, table = f"{root.url}/table", pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"]})
    with root.counter.counting() as wrote:
        write_deltalake(uri, table, storage_options=options)
    with root.counter.counting() as read:
        assert DeltaTable(uri, storage_options=options).to_pyarrow_table().sort_by("id") == table
    prefix = root.url.split("/", 3)[3]
    puts = wrote.keys(PUT)
    assert len(puts) == 2 and puts[0].endswith(".parquet") and puts[1] == f"{prefix}/table/_delta_log/00000000000000000000.json"
    assert wrote.of(PUT)[1].condition == "If-None-Match: *"  # the commit: a conditional put
    assert read[LIST] >= 1 and read[GET] >= 2 and read[PUT] == 0
    assert all(r.status in (200, 206, 404) for r in [*wrote.requests, *read.requests])


def test_pyiceberg_file_io_through_the_proxy(counted_s3_root):
    from pyiceberg.io.pyarrow import PyArrowFileIO

    root = counted_s3_root
    file_io = PyArrowFileIO(
        {
            "s3.endpoint": root.options["endpoint_url"],
            "s3.access-key-id": root.options["access_key_id"],
            "s3.secret-access-key": root.options["secret_access_key"],
            "s3.region": root.options["region"],
        }
    )
    with root.counter.counting() as tally:
        with file_io.new_output(f"{root.url}/iceberg/x.bin").create(overwrite=True) as out:
            out.write(b"iceberg" * 100)
        with file_io.new_input(f"{root.url}/iceberg/x.bin").open() as stream:
            assert stream.read() == b"iceberg" * 100
    assert tally[PUT] >= 1 and tally[GET] >= 1 and all(r.status in (200, 206) for r in tally.requests)
    assert {key.rsplit("/", 2)[-2:][0] for key in tally.keys()} == {"iceberg"}


def test_a_lake_on_the_counted_root_sends_what_the_counting_storage_counts(counted_s3_root):
    """The root's options open a lake; a landing's requests at the HTTP level are the Python-level ``Counting``'s."""
    from singerlake import Lake, SchemaWriter
    from singerlake.storage import S3Storage
    from support.storage import Counting

    url, options = counted_s3_root
    storage = Counting(S3Storage(url, **options))
    schema = {"type": "SCHEMA", "stream": "users", "key_properties": ["id"], "schema": {"type": "object", "properties": {}}}
    lines = [b'{"type":"RECORD","stream":"users","record":{"id":1}}']
    with counted_s3_root.counter.counting() as tally:
        with SchemaWriter(Lake(storage), "tap-count", schema) as writer:
            writer.commit([writer.write_file(lines, [1_796_000_000_000])])
    assert tally.kinds == storage.kinds() and tally[PUT] >= 2
    assert all(r.status in (200, 204, 404) for r in tally.requests)
    assert any(key.endswith("manifest.json") for key in tally.keys(PUT))


def test_concurrent_clients_are_each_counted_once(counted_s3_root):
    root, s3 = counted_s3_root, client(counted_s3_root)

    def put(n: int) -> None:
        s3.put_object(Bucket=root.bucket, Key=f"many/{n}", Body=io.BytesIO(b"x" * n))

    with root.counter.counting() as tally:
        threads = [threading.Thread(target=put, args=(n,)) for n in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert tally.kinds == {PUT: 16} and sorted(tally.keys()) == sorted(f"many/{n}" for n in range(16))
    assert tally.bytes_in == sum(range(16)) and {r.status for r in tally.requests} == {200}


@pytest.mark.parametrize(
    "method, target, headers, expected",
    [
        ("GET", "/b?list-type=2&prefix=raw%2Ft%2F&delimiter=%2F", {}, (LIST, "ListObjectsV2", "b", "raw/t/")),
        ("GET", "/b?prefix=x", {}, (LIST, "ListObjects", "b", "x")),
        ("GET", "/b?uploads", {}, (LIST, "ListMultipartUploads", "b", "")),
        ("GET", "/b/k?uploadId=1", {}, (LIST, "ListParts", "b", "k")),
        ("GET", "/", {}, (LIST, "ListBuckets", "", "")),
        ("GET", "/b?location", {}, (GET, "GetBucketLocation", "b", "")),
        ("GET", "/b/a/k%3D1.json", {}, (GET, "GetObject", "b", "a/k=1.json")),
        ("GET", "/b/k?tagging", {}, (GET, "GetObjectTagging", "b", "k")),
        ("HEAD", "/b", {}, (HEAD, "HeadBucket", "b", "")),
        ("PUT", "/b/k?partNumber=2&uploadId=x", {}, (PUT, "UploadPart", "b", "k")),
        ("PUT", "/b/k?partNumber=2&uploadId=x", {"x-amz-copy-source": "b/j"}, (PUT, "UploadPartCopy", "b", "k")),
        ("PUT", "/b/k", {"x-amz-copy-source": "b/j"}, (PUT, "CopyObject", "b", "k")),
        ("PUT", "/b", {}, (PUT, "CreateBucket", "b", "")),
        ("POST", "/b/k?uploads", {}, (POST, "CreateMultipartUpload", "b", "k")),
        ("POST", "/b/k?uploadId=x", {}, (POST, "CompleteMultipartUpload", "b", "k")),
        ("POST", "/b?delete", {}, (DELETE, "DeleteObjects", "b", "")),
        ("DELETE", "/b/k?uploadId=x", {}, (DELETE, "AbortMultipartUpload", "b", "k")),
        ("DELETE", "/b", {}, (DELETE, "DeleteBucket", "b", "")),
        ("GET", "/k/x", {"host": "b.localhost:9000"}, (GET, "GetObject", "b", "k/x")),
        ("GET", "/b/k", {"host": "127.0.0.1:9000"}, (GET, "GetObject", "b", "k")),
    ],
)
def test_each_request_is_the_operation_it_names(method, target, headers, expected):
    request = classify(method, target, headers)
    assert (request.kind, request.op, request.bucket, request.key) == expected


def test_stopped_it_accepts_no_more_requests(moto_server):
    with S3Counter(moto_server.endpoint) as counter:
        endpoint = counter.endpoint
    connection = http.client.HTTPConnection(urlsplit(endpoint).hostname, urlsplit(endpoint).port, timeout=5)
    with pytest.raises(OSError):
        connection.request("GET", "/")
        connection.getresponse()
