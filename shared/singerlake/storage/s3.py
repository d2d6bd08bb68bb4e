"""S3 backend on boto3: conditional PutObject/DeleteObject for CAS, smart-open for streaming reads.

Credentials come from the standard chain, a profile, or explicit keys; none of them is ever part of
``url``, ``repr`` or an error message. The client is built lazily and dropped when pickled, so a
storage object can be shipped to Spark executors.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

from singerlake.storage.base import Blob, NotFound, ObjectInfo, PreconditionFailed, Storage, StorageError, check_key

# One client per process and set of options, shared by every S3Storage (a task's file writers, a
# reused Spark worker's tasks): building a client costs ~0.1-0.5 s of CPU, and boto3 clients are thread-safe.
_CLIENTS: dict[tuple, Any] = {}
_CLIENTS_LOCK = threading.Lock()

_CONFLICT_CODES = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
_MISSING_CODES = {"NoSuchKey", "404", "NotFound"}
READ_ATTEMPTS = 3  # a read whose body fails its checksum (torn in transit) is made again, this many times in all


class S3Storage(Storage):
    parallel_requests = 32  # each request waits ~10-100 ms on the network; the client pools as many connections

    def __init__(
        self,
        url: str,
        *,
        region: str | None = None,
        profile: str | None = None,
        endpoint_url: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
    ):
        if not url.startswith("s3://") or len(url) <= 5:
            raise StorageError(f"not an s3:// URL: {url!r}")
        bucket, _, prefix = url[5:].partition("/")
        if not bucket:
            raise StorageError(f"{url!r} names no bucket")
        self.url = url.rstrip("/")
        self.bucket = bucket
        self.prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        self._options = {
            "region": region,
            "profile": profile,
            "endpoint_url": endpoint_url,
            "access_key_id": access_key_id,
            "secret_access_key": secret_access_key,
            "session_token": session_token,
        }
        self._client = None

    def open_options(self) -> dict[str, str]:
        return {name: value for name, value in self._options.items() if value}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        return state

    @property
    def client(self):
        if self._client is None:
            key = (os.getpid(), self.parallel_requests, *sorted(self._options.items()))  # a forked child builds its own
            with _CLIENTS_LOCK:  # threads asking at once (an executor's file writers) build one client, not one each
                if key not in _CLIENTS:
                    _CLIENTS[key] = self._new_client()
                self._client = _CLIENTS[key]
        return self._client

    def _new_client(self):
        import boto3
        from botocore.config import Config

        opts = self._options
        session = boto3.session.Session(profile_name=opts["profile"], region_name=opts["region"])
        client = session.client(
            "s3",
            endpoint_url=opts["endpoint_url"],
            aws_access_key_id=opts["access_key_id"],
            aws_secret_access_key=opts["secret_access_key"],
            aws_session_token=opts["session_token"],
            config=Config(retries={"max_attempts": 8, "mode": "standard"}, max_pool_connections=self.parallel_requests),
        )
        client.meta.events.register("before-call.s3", _no_expect_for_small_bodies)
        return client

    def _key(self, key: str) -> str:
        return self.prefix + check_key(key)

    def _error(self, exc: Exception, key: str, action: str) -> Exception:
        from botocore.exceptions import ClientError

        if isinstance(exc, ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            if code == "NoSuchBucket":  # not a missing object: the lake root itself is wrong
                return StorageError(f"{action} {self.url_of(key)} failed: bucket {self.bucket!r} does not exist")
            if code in _CONFLICT_CODES or status in ("412", "409"):
                return PreconditionFailed(f"{self.url_of(key)}: conditional {action} lost ({code})")
            if code in _MISSING_CODES or status == "404":
                return NotFound(f"{self.url_of(key)} does not exist")
            return StorageError(f"{action} {self.url_of(key)} failed: {code} {exc.response['Error'].get('Message', '')}")
        return StorageError(f"{action} {self.url_of(key)} failed: {type(exc).__name__}: {exc}")

    def read(self, key: str) -> Blob:
        from botocore.exceptions import FlexibleChecksumError

        full_key = self._key(key)
        for attempt in range(1, READ_ATTEMPTS + 1):
            try:
                response = self.client.get_object(Bucket=self.bucket, Key=full_key)
                return Blob(response["Body"].read(), response["ETag"])
            except FlexibleChecksumError as exc:  # the body was torn on its way: read it again
                if attempt == READ_ATTEMPTS:
                    raise self._error(exc, key, "read") from exc
            except Exception as exc:
                raise self._error(exc, key, "read") from exc
        raise AssertionError("unreachable")

    def read_etag(self, key: str) -> str:
        full_key = self._key(key)
        try:
            return self.client.head_object(Bucket=self.bucket, Key=full_key)["ETag"]
        except Exception as exc:
            raise self._error(exc, key, "head") from exc

    def write(
        self,
        key: str,
        data: bytes,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
        durable: bool = True,
        content_type: str | None = None,
    ) -> str:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key), "Body": data}
        if content_type:
            kwargs["ContentType"] = content_type
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        elif if_match is not None:
            kwargs["IfMatch"] = if_match
        try:
            return self.client.put_object(**kwargs)["ETag"]
        except Exception as exc:
            error = self._error(exc, key, "write")
            if if_match is not None and isinstance(error, NotFound):
                error = PreconditionFailed(f"{self.url_of(key)} no longer exists (expected etag {if_match})")
            raise error from exc

    def write_stream(self, key: str, chunks: Iterable[bytes], *, if_none_match: bool = False, content_type: str | None = None) -> None:
        """One PutObject up to PART_BYTES, else a multipart upload of PART_BYTES parts, completed only
        once every chunk arrived (aborted otherwise): memory holds one part, never the object."""
        buffer = bytearray()
        upload_id = None
        parts: list[dict] = []
        full_key = self._key(key)
        extra: dict[str, Any] = {"ContentType": content_type} if content_type else {}
        try:
            for chunk in chunks:
                buffer += chunk
                while len(buffer) >= PART_BYTES:
                    if upload_id is None:
                        upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=full_key, **extra)["UploadId"]
                    self._upload_part(full_key, upload_id, parts, bytes(buffer[:PART_BYTES]))
                    del buffer[:PART_BYTES]
            if upload_id is None:
                self.write(key, bytes(buffer), if_none_match=if_none_match, content_type=content_type)
                return
            if buffer or not parts:
                self._upload_part(full_key, upload_id, parts, bytes(buffer))
            condition = {"IfNoneMatch": "*"} if if_none_match else {}
            self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=full_key, UploadId=upload_id, MultipartUpload={"Parts": parts}, **condition
            )
            upload_id = None
        except StorageError:
            raise
        except Exception as exc:
            if not _is_client_error(exc):
                raise  # the source's own error (a file that changed): reported as it is
            raise self._error(exc, key, "write") from exc
        finally:
            if upload_id is not None:  # the source failed or the upload did: no part is left to bill
                try:
                    self.client.abort_multipart_upload(Bucket=self.bucket, Key=full_key, UploadId=upload_id)
                except Exception:
                    pass

    def _upload_part(self, full_key: str, upload_id: str, parts: list[dict], body: bytes) -> None:
        number = len(parts) + 1
        etag = self.client.upload_part(Bucket=self.bucket, Key=full_key, UploadId=upload_id, PartNumber=number, Body=body)["ETag"]
        parts.append({"ETag": etag, "PartNumber": number})

    def delete(self, key: str, *, if_match: str | None = None) -> None:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key)}
        if if_match is not None:
            kwargs["IfMatch"] = if_match
        try:
            self.client.delete_object(**kwargs)
        except Exception as exc:
            error = self._error(exc, key, "delete")
            if isinstance(error, NotFound) and if_match is None:
                return
            if isinstance(error, NotFound):
                error = PreconditionFailed(f"{self.url_of(key)} no longer exists (expected etag {if_match})")
            raise error from exc

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        # Sorted here: S3-compatible servers differ from AWS's byte order (SeaweedFS lists a
        # "directory" before the keys beside it, raw/a/x/1 before raw/a/x-1).
        paginator = self.client.get_paginator("list_objects_v2")
        found = []
        try:
            after = {"StartAfter": self.prefix + start_after} if start_after else {}
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix, **after):
                for item in page.get("Contents", []):
                    key = item["Key"][len(self.prefix) :]
                    found.append(ObjectInfo(key, item["Size"], item["LastModified"].timestamp()))
        except Exception as exc:
            raise self._error(exc, prefix, "list") from exc
        yield from sorted(found, key=lambda info: info.key)

    def list_dirs(self, prefix: str) -> list[str]:
        paginator = self.client.get_paginator("list_objects_v2")
        names = []
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix, Delimiter="/"):
                for common in page.get("CommonPrefixes", []):
                    names.append(common["Prefix"][len(self.prefix + prefix) :].rstrip("/"))
        except Exception as exc:
            raise self._error(exc, prefix, "list") from exc
        return sorted(names)

    def open_read(self, key: str) -> BinaryIO:
        import smart_open

        self.read_etag(key)  # a clear NotFound before streaming starts
        return smart_open.open(
            f"s3://{self.bucket}/{self._key(key)}",
            "rb",
            compression="disable",
            transport_params={"client": self.client},
        )

    def root_exists(self) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_bucket(Bucket=self.bucket)
            return True
        except Exception as exc:  # also an unreachable endpoint: a StorageError naming the root
            if isinstance(exc, ClientError) and str(exc.response.get("Error", {}).get("Code")) in ("404", "NoSuchBucket", "NotFound"):
                return False
            raise self._error(exc, "", "head bucket") from exc

    def check_writable(self) -> None:
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except Exception as exc:
            raise StorageError(f"lake root {self.url}: bucket {self.bucket!r} is missing or not accessible: {exc}") from exc
        probe = f"{self.prefix}.singerlake-write-check-{uuid.uuid4().hex}"
        try:
            self.client.put_object(Bucket=self.bucket, Key=probe, Body=b"")
            self.client.delete_object(Bucket=self.bucket, Key=probe)
        except Exception as exc:
            raise StorageError(f"lake root {self.url} is not writable: {exc}") from exc


EXPECT_MIN_BYTES = 1 << 20
PART_BYTES = 16 << 20  # multipart part size of streamed writes: 640 parts hold 10 GB, well under S3's 10,000


def _is_client_error(exc: Exception) -> bool:
    from botocore.exceptions import BotoCoreError, ClientError

    return isinstance(exc, (ClientError, BotoCoreError))


def _no_expect_for_small_bodies(params, **kwargs) -> None:
    """botocore asks to wait for ``100 Continue`` before sending any body: a round trip more per
    PUT, worth it only for large bodies. Locks, manifests and small data files go in one."""
    from botocore.utils import determine_content_length

    headers = params.get("headers", {})
    if "Expect" in headers and (determine_content_length(params.get("body")) or 0) < EXPECT_MIN_BYTES:
        del headers["Expect"]
