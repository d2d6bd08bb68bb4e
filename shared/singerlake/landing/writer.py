"""Writing one stream-schema: lock, data files, fenced commits (SPEC.md §8-§9)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from singerlake.changes import write_marker
from singerlake.commits.commit import claim_writer, commit_files, update_manifest
from singerlake.commits.errors import LockLost, LockNeeded, Overtaken
from singerlake.commits.lock import DEFAULT_DRIFT_S, DEFAULT_LEASE_S, DEFAULT_WAIT_S, Lock
from singerlake.format.datafile import DEFAULT_COMPRESSLEVEL, write_data_file
from singerlake.format.manifest import Manifest
from singerlake.format.parts import PartStore
from singerlake.format.scan import scan_stream
from singerlake.format.schema_hash import schema_hash
from singerlake.lake import Lake
from singerlake.storage import NotFound


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
        self.manifest: Manifest | None = None  # as this writer last read or wrote it
        self.created = False  # the open created the stream's manifest (it had none)
        self._absent = False  # ... and knew the stream to be new: created unread

    def open(self, new_stream: bool = False, is_new: Callable[[], bool] | None = None) -> SchemaWriter:
        """Read the stream's manifest, take the lock, and create the manifest if there is none (SPEC.md §9, §10)."""
        self.look(new_stream, is_new)
        return self.take()

    def look(self, new_stream: bool = False, is_new: Callable[[], bool] | None = None) -> None:
        """Read the stream's manifest: where the first commit starts from (the writer registers in that
        commit, §9), and the open's one request besides the lock when the stream has a manifest. Read
        before the lock: a stale copy only makes the first commit read again. A stream without a
        manifest is created by ``take``: unread and unscanned when it is known to be new,
        ``new_stream`` (the caller's listing showed no directory for it) or ``is_new()`` (asked only
        once the read found no manifest, and before the lock: a listing taken after it would show
        this writer's own lock, §7), else seeded from a scan."""
        self.manifest = None if new_stream else self._read_manifest()
        self.created = self.manifest is None
        self._absent = new_stream or (self.created and is_new is not None and is_new())

    def take(self) -> SchemaWriter:
        """Take the lock, with a writer id above the registered one read (§8), and create the manifest if
        ``look`` found none, with this writer registered, before any data file is written (§7). A
        writer that took the lock over registers now (§9): from then on no commit of the writer it
        took it from is accepted; should that fail, the lock is left to go stale, never released, so
        that the next writer takes it over too and registers."""
        owner = self.manifest.writers.get(self.schema_hash, {}).get("writer_id") if self.manifest else None
        self.lock.acquire(after=owner if isinstance(owner, str) else None)
        try:
            if self.created:
                self.lake.ensure_names(self.paths)
                self._register(missing=True)
            elif self.took_over:
                self._register()
        except BaseException:
            if self.took_over:
                self.lock.abandon()
            else:
                self.lock.release()
            raise
        return self

    def _register(self, missing: bool = False) -> None:
        """Register in the manifest now: create it (``missing``: ``look`` found none; seeded from a scan
        unless the stream is known to be new), or swap it from the copy ``look`` read."""
        storage, tries = self.lake.storage, [missing]
        seed = functools.partial(scan_stream, storage, self.paths)

        def swap(proven: str | None) -> Manifest:
            first, tries[0] = tries[0], False  # only the first attempt may take the read for granted
            return update_manifest(
                storage, self.paths, self._claim(proven), seed=seed, last=self.manifest, absent=self._absent and first,
                missing=first, durable=False,
            )  # fmt: skip

        self.manifest = self._fenced(swap)

    def _claim(self, proven: str | None) -> Callable[[Manifest], None]:
        return lambda manifest: claim_writer(manifest, self.schema_hash, self.lock.writer_id, proven)

    def _fenced(self, swap: Callable[[str | None], Manifest]) -> Manifest:
        """Run ``swap``, which claims the stream-schema for this writer (``claim_writer``). When it finds a
        writer registered that it cannot tell to be earlier (a smaller id), this writer proves it still
        holds its lock by rewriting it under an id above that one (§9), and swaps again; a writer that
        lost its lock gets the refusal."""
        proven = None
        for _ in range(3):
            try:
                return swap(proven)
            except Overtaken as exc:
                try:
                    self.lock.renew_id(above=exc.owner)
                except LockLost:
                    raise exc from None
                proven = exc.owner
        return swap(proven)

    def _read_manifest(self) -> Manifest | None:
        storage, key = self.lake.storage, self.paths.manifest
        try:
            blob = storage.read(key)
        except NotFound:
            return None
        manifest = Manifest.from_bytes(blob.data, storage.url_of(key), PartStore(storage, self.paths))
        manifest.stored = blob
        return manifest

    @property
    def took_over(self) -> bool:
        """The lock was taken over from a writer that went stale: it may have died between a commit and
        bringing the catalogue up to date (SPEC.md §9)."""
        return self.lock.took_over

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

    def commit(self, records: list[dict[str, Any]], publish: bool = True, last: Manifest | None = None) -> Manifest:
        """All of ``records`` become visible at once, or (CommitRejected, CommitConflict, LockLost) none do.

        ``publish``: bring the catalogue and ``singerlake.json`` up to date too, and name the stream in
        the change log (SPEC.md §16); landing passes False and does both once per batch for all its
        streams instead. ``last``: the stream's manifest as this process last read or wrote it, when
        newer than this writer's own copy (another schema's commit, an activation).
        """
        self.lock.check()  # a writer that knows it lost its lock commits nothing more
        manifest = self._fenced(
            lambda proven: commit_files(
                self.lake.storage,
                self.paths,
                records,
                {self.schema_hash: (self.schema, self.key_properties)},
                writer_id=self.lock.writer_id,
                last=last or self.manifest,  # one write, nothing parsed, when nobody else committed since
                proven_over=proven,
            )
        )
        self.manifest = manifest
        if publish:
            self.lake.publish_stream(manifest, self.annotations)
            write_marker(self.lake.storage, self.paths.tap_id, [self.stream])
        return manifest

    @property
    def taken(self) -> bool:
        """The lock was acquired in this run (held, or released since)."""
        return self.lock.writer_id is not None

    def commit_unlocked(
        self, records: list[dict[str, Any]], entry: Callable[[Manifest], Any], expected: Any, last: Manifest | None = None
    ) -> Manifest:
        """The run's only commit of this stream-schema, without taking the lock (SPEC.md §9): inside each
        attempt of the swap, before the root is written, the catalogue entry the commit leaves
        (``entry(manifest)``) must be ``expected`` and no lock may exist; else LockNeeded, nothing
        written, and the caller takes the lock and commits as usual. Carries no writer id."""
        if self.manifest is None or self.taken:
            raise LockNeeded(self.lock.key)

        def check(manifest: Manifest) -> None:
            if entry(manifest) != expected or not self.lock.absent():
                raise LockNeeded(self.lock.key)

        schemas = {self.schema_hash: (self.schema, self.key_properties)}
        self.manifest = commit_files(self.lake.storage, self.paths, records, schemas, last=last or self.manifest, check=check)
        return self.manifest

    def close(self) -> None:
        self.lock.release()

    def __enter__(self) -> SchemaWriter:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()
