"""Writing one stream-schema: lock, data files, fenced commits (SPEC.md §8-§9)."""

from __future__ import annotations

import functools
import json
from typing import Any

from singerlake.commits.commit import commit_files, register_writer
from singerlake.commits.lock import DEFAULT_DRIFT_S, DEFAULT_LEASE_S, DEFAULT_WAIT_S, Lock
from singerlake.format.datafile import DEFAULT_COMPRESSLEVEL, write_data_file
from singerlake.format.manifest import Manifest
from singerlake.format.scan import scan_stream
from singerlake.format.schema_hash import schema_hash
from singerlake.lake import Lake


class SchemaWriter:
    """Holds the lock of one stream-schema while files are written and committed.

    Data files may be written anywhere (the driver, or Spark executors through
    ``singer_file.write_data_file``); they only become visible through ``commit``.
    """

    def __init__(
        self,
        lake: Lake,
        tap_id: str,
        schema_message: dict[str, Any],
        *,
        schema_line: bytes | None = None,
        work_id: str | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        drift_s: float = DEFAULT_DRIFT_S,
        wait_s: float = DEFAULT_WAIT_S,
        annotations: dict[str, Any] | None = None,
        compresslevel: int = DEFAULT_COMPRESSLEVEL,
    ):
        self.lake = lake
        self.stream = schema_message["stream"]
        self.paths = lake.paths(tap_id, self.stream)
        self.schema = schema_message["schema"]
        self.key_properties = list(schema_message.get("key_properties") or [])
        self.schema_hash = schema_hash(self.schema, self.key_properties)
        self.schema_line = schema_line or json.dumps(schema_message, ensure_ascii=False).encode("utf-8")
        self.work_id = work_id
        self.annotations = annotations
        self.compresslevel = compresslevel
        self.lock = Lock(lake.storage, self.paths.lock(self.schema_hash), lease_s=lease_s, drift_s=drift_s, wait_s=wait_s)
        self.manifest: Manifest | None = None  # as this writer last wrote it

    def open(self, new_stream: bool = False) -> SchemaWriter:
        """Take the lock and register as the stream-schema's writer (the fence, SPEC.md §9).

        ``new_stream``: the stream held no object at all when the caller listed the tap, so the
        registration creates its manifest straight away: no read, no scan (SPEC.md §7).
        """
        self.lock.acquire()
        try:
            self.lake.ensure_names(self.paths)
            storage = self.lake.storage
            seed = functools.partial(scan_stream, storage, self.paths)
            self.manifest = register_writer(storage, self.paths, self.schema_hash, self.lock.writer_id, seed=seed, absent=new_stream)
        except BaseException:
            self.lock.release()
            raise
        return self

    def write_file(self, record_lines: list[bytes], times_ms: list[int]) -> dict[str, Any]:
        self.lock.check()
        return write_data_file(
            self.lake.storage,
            self.paths,
            self.schema_hash,
            self.schema_line,
            record_lines,
            times_ms,
            work_id=self.work_id,
            compresslevel=self.compresslevel,
        )

    def commit(self, records: list[dict[str, Any]], publish: bool = True) -> Manifest:
        """All of ``records`` become visible at once, or (CommitRejected, CommitConflict) none do.

        ``publish``: bring the catalogue and ``singerlake.json`` up to date too; landing passes False
        and publishes once per batch for all its streams instead.
        """
        manifest = commit_files(
            self.lake.storage,
            self.paths,
            records,
            {self.schema_hash: (self.schema, self.key_properties)},
            writer_id=self.lock.writer_id,
            last=self.manifest,  # one write, nothing parsed, when nobody else committed since
        )
        self.manifest = manifest
        if publish:
            self.lake.publish_stream(manifest, self.annotations)
        return manifest

    def close(self) -> None:
        self.lock.release()

    def __enter__(self) -> SchemaWriter:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()
