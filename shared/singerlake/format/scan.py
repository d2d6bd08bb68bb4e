"""Rebuilding metadata from the data files themselves (SPEC.md §7): metadata is optional."""

from __future__ import annotations

import gzip
import io
from concurrent.futures import ThreadPoolExecutor

from singerlake.format.datafile import summarise
from singerlake.format.errors import CorruptFile
from singerlake.format.layout import DATA_SUFFIX, DataFileName, StreamPaths
from singerlake.format.manifest import Manifest, versions_from_files
from singerlake.format.metadata import blake2_hex, make_record
from singerlake.format.names import encode_segment, normalise_label
from singerlake.format.needs import FileNeeds, properties_of
from singerlake.format.schema_hash import is_schema_hash, schema_hash
from singerlake.storage import Storage


def data_file_keys(storage: Storage, paths: StreamPaths) -> list[str]:
    """Every data file under the stream, whether committed or not."""
    prefix = f"{paths.stream_dir}/"
    return [
        info.key
        for info in storage.list(prefix)
        if info.key.endswith(DATA_SUFFIX) and is_schema_hash(info.key[len(prefix) :].split("/")[0])
    ]


def describe_file(storage: Storage, paths: StreamPaths, key: str, with_needs: bool = False) -> tuple[dict, dict, list[str]]:
    """Read one data file and return (metadata record, schema, key properties); ``with_needs``: the
    record with the file's column statistics (SPEC.md §5), which cost decoding every record."""
    name = DataFileName.parse(key)
    if name.stream_segment != encode_segment(paths.stream):
        raise CorruptFile(f"{storage.url_of(key)}: file name does not belong to stream {paths.stream!r}")
    data = storage.read(key).data
    summary = summarise(data, storage.url_of(key))
    schema = summary.schema_message.get("schema")
    keys = summary.schema_message.get("key_properties") or []
    if not isinstance(schema, dict) or schema_hash(schema, keys) != name.schema_hash:
        raise CorruptFile(f"{storage.url_of(key)}: its SCHEMA message does not hash to {name.schema_hash}")
    record = make_record(
        file_id=name.file_id,
        path=key,
        where=normalise_label(paths.tap_id),
        what=normalise_label(paths.stream),
        start=name.start_ms,
        end=name.end_ms,
        content_hash=blake2_hex(data),
        size=len(data),
        records=summary.records,
        schema_hash=name.schema_hash,
    )
    if with_needs:
        record = {**record, **file_statistics(data, schema)}
    return record, schema, keys


def file_statistics(data: bytes, schema: dict) -> dict:
    """The ``needs`` and ``undeclared`` fields of a data file's stored bytes, under its ``schema``."""
    needs = FileNeeds(properties_of(schema))
    with gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb") as unzipped:
        unzipped.readline()  # the SCHEMA line
        while block := unzipped.read(1 << 20):
            needs.add_lines(block + unzipped.readline())
    return needs.fields()


def scan_stream(storage: Storage, paths: StreamPaths, keys: list[str] | None = None, threads: int = 16) -> Manifest:
    """A manifest holding every complete, valid data file of the stream, one commit per file in id
    (creation) order. Files that cannot be read raise CorruptFile naming them."""
    keys = data_file_keys(storage, paths) if keys is None else keys
    with ThreadPoolExecutor(max_workers=threads) as pool:
        described = list(pool.map(lambda key: describe_file(storage, paths, key), keys))
    return manifest_from_described(paths, described)


def manifest_from_described(paths: StreamPaths, described: list[tuple[dict, dict, list[str]]]) -> Manifest:
    records = sorted((record for record, _, _ in described), key=lambda r: r["id"])
    schemas = {record["schema_hash"]: (schema, keys) for record, schema, keys in described}
    manifest = Manifest(paths.tap_id, paths.stream, versions_from_files(records, schemas))
    manifest.tail = [{**record, "commit": number} for number, record in enumerate(records, 1)]  # one commit per file
    manifest.commits = len(records)
    return manifest
