"""Records of SDK BATCH messages (jsonl or parquet files, optionally gzipped), as raw JSON bytes."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote, urlparse

from singerlake.format.errors import BadInput
from singerlake.storage import S3Storage, Storage


def _open(url: str, lake_storage: Storage):
    parsed = urlparse(url)
    if parsed.scheme in ("", "file"):
        return open(unquote(parsed.path) if parsed.scheme else url, "rb")
    if parsed.scheme == "s3":
        import smart_open

        params = {"client": lake_storage.client} if isinstance(lake_storage, S3Storage) else {}
        return smart_open.open(url, "rb", compression="disable", transport_params=params)
    raise BadInput(f"BATCH file {url!r}: unsupported location (use file:// or s3://)")


def read_batch_records(message: dict[str, Any], lake_storage: Storage, number: int) -> Iterator[tuple[str, bytes]]:
    """Yield (file url, record JSON bytes). JSONL records are passed through byte for byte."""
    encoding = message.get("encoding") or {}
    kind, compression = encoding.get("format"), encoding.get("compression")
    manifest = message.get("manifest")
    if not isinstance(manifest, list):
        raise BadInput(f"line {number}: BATCH message needs a 'manifest' list of file URLs")
    for url in manifest:
        try:
            with _open(url, lake_storage) as raw:
                stream = gzip.GzipFile(fileobj=raw) if compression == "gzip" else raw
                if kind == "jsonl":
                    for line in stream:
                        if line.strip():
                            yield url, line.rstrip(b"\r\n")
                elif kind == "parquet":
                    import pyarrow.parquet as pq

                    for row in pq.read_table(stream).to_pylist():
                        yield url, json.dumps(row, default=str, ensure_ascii=False).encode("utf-8")
                else:
                    raise BadInput(f"line {number}: BATCH encoding format {kind!r} is not supported (jsonl, parquet)")
        except OSError as exc:
            raise BadInput(f"line {number}: cannot read BATCH file {url}: {exc}") from exc
