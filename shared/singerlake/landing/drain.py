"""The drain of landing (SPEC.md §10): batch after batch, one Spark job writes every segment's files,
commits go out in parallel across streams, then the batch's STATE is emitted.

One thread takes batches in order, so a STATE never passes the records before it. A stream-schema's
writer reads its manifest on a bounded pool as soon as its first record is read (``open_writer``),
so a first batch's opens overlap Spark's start-up; it takes its lock there only when it creates the
stream's manifest, which must exist before any of its data files (SPEC.md §7), else before its
batch's files are written. A stream-schema whose only commit of the run is in the last batch makes
it without the lock while none exists (§9). Then each stream commits its segments and ACTIVATE_VERSION marks in
order, streams side by side on the same pool, each commit its own fenced compare-and-swap (a
writer registers in its first, §9). The catalogue and ``singerlake.json`` are written only when
what they hold changed: a stream's catalogue entry when its commits changed it (a new stream, a new
latest version) or when its writer took a stale lock over (its holder may have died before
writing it), and a stream's lock goes only once its entry is written.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from singerlake.changes import Unmarked
from singerlake.commits.commit import update_manifest
from singerlake.commits.errors import LockNeeded
from singerlake.format import catalogue as cat
from singerlake.format.datafile import gzip_member
from singerlake.format.manifest import Manifest
from singerlake.format.needs import properties_of
from singerlake.format.scan import scan_stream
from singerlake.lake import Lake
from singerlake.landing import spark_write
from singerlake.landing.batch import ActivateVersion, Batch, Segment
from singerlake.landing.errors import LandingError, RootUnusable
from singerlake.landing.writer import SchemaWriter
from singerlake.pause import pause_point
from singerlake.storage import NotFound, PreconditionFailed, StorageError
from singerlake.times import iso_ms

log = logging.getLogger("singerlake.landing")


@dataclass
class DrainJob:
    batch: Batch
    state: bytes | None
    final: bool = False  # the run's last batch: a stream's locks are released once its commits are done


class Drain:
    """Runs DrainJobs in order on one thread; ``submit`` waits while ``queued`` jobs are already in line."""

    def __init__(self, lake: Lake, settings: Any, spark: Callable[[], Any], emit_state: Callable[[bytes], None], queued: int):
        self.lake = lake
        self.settings = settings
        self.spark = spark
        self.emit_state = emit_state
        self.error: BaseException | None = None
        self.writers: dict[tuple[str, str], Future[SchemaWriter]] = {}
        self._writers_lock = threading.Lock()  # the reader opens writers, the drain looks them up
        # Per stream, the catalogue entry the catalogue holds, as far as this run knows: the one it wrote,
        # or the one of the manifest its writer read (whoever committed that wrote its entry, SPEC.md §9).
        self._published: dict[str, dict] = {}
        self._unpublished: dict[str, dict] = {}  # committed entries not written yet: their locks wait for them
        self._latest: dict[str, Manifest] = {}  # per stream, the manifest as this run last read or wrote it
        self._unmarked = Unmarked(lake.storage, settings.tap_id)  # streams committed since the last change marker (SPEC.md §16)
        self._metadata = threading.Lock()
        # singerlake.json: written when this run may have a new tap (it created a stream's manifest), has
        # annotations to record, or took a lock over; else never read.
        self._tap_due = any(value is not None for value in (settings.annotations or {}).values())
        self._listed: set[str] | None = None  # the tap's stream directories, listed at the run's first stream without a manifest
        self._listing = threading.Lock()
        self._first_look = threading.Lock()
        self._looked = threading.Event()
        self.opened = False  # a writer opened: the lake root answered, and took a write
        # Opens, commits and releases of many streams: as many at once as the storage serves well.
        self._pool = ThreadPoolExecutor(lake.storage.parallel_requests, thread_name_prefix="singerlake-commit")
        self._batches = 0
        self._records = 0
        self._started = time.monotonic()
        self._jobs: queue.Queue[DrainJob | None] = queue.Queue(maxsize=max(1, queued))
        self._thread = threading.Thread(target=self._loop, name="singerlake-drain", daemon=True)
        self._thread.start()

    # -- the caller's side -------------------------------------------------------------------------
    def submit(self, job: DrainJob) -> None:
        while True:
            self.raise_if_failed()
            try:
                self._jobs.put(job, timeout=0.2)
                return
            except queue.Full:
                continue

    def raise_if_failed(self) -> None:
        if isinstance(self.error, RootUnusable):
            raise self.error  # a setting at fault, not a batch: nothing was written
        if self.error is not None:
            cause = self.error
            if isinstance(cause, ConnectionError) or type(cause).__name__.startswith("Py4J"):
                cause = f"the Spark driver JVM stopped responding (did it die?): {cause}"
            raise LandingError(f"landing failed, nothing after the last emitted STATE was committed: {cause}") from self.error

    def stop(self) -> None:
        """Let the jobs already handed over finish, then end the thread."""
        while self._thread.is_alive():
            try:
                self._jobs.put(None, timeout=0.2)
                break
            except queue.Full:
                continue
        self._thread.join()

    def close(self) -> None:
        """Release every lock, side by side (also after a failure: uncommitted files stay invisible), but
        those of streams whose catalogue entry could not be written: left to go stale, so that the next
        writer takes them over and writes it (SPEC.md §9). First, the run's closing change marker (SPEC.md §16)."""
        try:
            self._unmarked.mark(final=True)
        except Exception as exc:  # no STATE depends on it: a tap that resends those records marks them again
            log.warning("could not write the change marker of %s: %s", self.settings.tap_id, exc)
        wait(self.writers.values())  # a writer still taking its lock is released once it has it
        opened = [future.result() for future in self.writers.values() if future.exception() is None]
        kept = [writer for writer in opened if writer.stream in self._unpublished]
        if kept:
            log.warning(
                "left the locks of %d stream(s) whose catalogue entry could not be written (e.g. %s): the next writer takes "
                "them over after their lease and writes it",
                len(kept),
                kept[0].stream,
            )
        for writer in kept:
            writer.lock.abandon()
        opened = [writer for writer in opened if writer not in kept]
        for writer, outcome in zip(opened, self._pool.map(_release, opened), strict=True):
            if outcome is not None:
                log.warning("could not release %s: %s", writer.lock.key, outcome)
        self.writers.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)

    # -- the drain thread ----------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if self.error is not None:
                continue  # a batch failed: later ones must not commit past it
            try:
                self._run(job)
            except BaseException as exc:  # reported to the reading thread, which fails the run
                self.error = exc

    def _run(self, job: DrainJob) -> None:
        started = time.monotonic()
        here = job.final and getattr(self.spark, "skip", lambda: False)()  # the run's only batch, before Spark began to start
        segments = job.batch.segments()
        records = sum(segment.records for segment in segments)
        writers = [self.open_writer(segment.schema).result() for segment in segments]  # manifests exist first (§7)
        unlocked = self._commits_without_lock(job) if job.final else set()
        to_take = {id(writer): writer for writer in writers if not writer.taken and writer.stream not in unlocked}
        for taking in [self._pool.submit(self._take, writer) for writer in to_take.values()]:
            taking.result()
        files = self._write(segments, here) if segments else []
        if self.settings.confirm_files:
            self._confirm_stored([file for segment_files in files for file in segment_files])
        written = time.monotonic()
        pause_point("land-before-commit")
        files_of = {id(segment): segment_files for segment, segment_files in zip(segments, files, strict=True)}
        commits = [
            self._pool.submit(self._commit_stream, stream, items, files_of, job.final) for stream, items in job.batch.streams.items()
        ]
        wait(commits)
        failed = any(future.exception() is not None for future in commits)
        try:
            self._publish()  # what did commit, also when another stream's commit failed
        finally:
            try:
                if job.state is not None or job.final or failed:
                    self._unmarked.mark(final=job.final)  # before the STATE: every commit it covers is named (SPEC.md §16)
            finally:
                for future in commits:
                    future.result()  # the first failure fails the batch (after every stream's commit has ended)
        if job.final:
            self._release(job.batch.streams)  # those whose entries had to be written first
        if job.state is not None:
            self.emit_state(job.state)
        self._report(records, len(job.batch.streams), sum(len(f) for f in files), started, written, here)

    def open_writer(self, schema: Any) -> Future[SchemaWriter]:
        """The stream-schema's writer, opening (manifest read, lock) on the pool if it is new to this run."""
        key = (schema.message["stream"], schema.hash)
        with self._writers_lock:
            if key not in self.writers:
                self.writers[key] = self._pool.submit(self._open, self._new_writer(schema))
            return self.writers[key]

    def _open(self, writer: SchemaWriter) -> SchemaWriter:
        stream_dir = writer.paths.stream_dir
        try:
            # The run's first look goes alone: when it finds no manifest, the listing it takes tells the
            # others which streams are new, so they create theirs unread (a new tap: one read in all).
            with self._first_look if not self._looked.is_set() else contextlib.nullcontext():
                writer.look(new_stream=self._listed_as_new(stream_dir), is_new=lambda: self._is_new_stream(stream_dir))
                self._looked.set()
            if writer.created:
                writer.take()  # it creates the manifest; a stream that has one is locked at its first commit that needs it
        except StorageError as exc:
            if not self.opened and not isinstance(exc, (NotFound, PreconditionFailed)):
                raise RootUnusable(f"setting 'lake_root': {exc}") from exc  # the run's first requests: the root is at fault
            raise
        self.opened = True
        with self._metadata:
            stream = writer.stream
            if writer.created:
                self._tap_due = True  # a new tap
                self._published.pop(stream, None)  # its entry is written at its next commit
            elif stream not in self._published and writer.manifest.versions:
                self._published[stream] = cat.catalog_entry(writer.manifest, stream_dir)
            self._remember(stream, writer.manifest)
        return writer

    def _take(self, writer: SchemaWriter) -> SchemaWriter:
        """Take the writer's lock, once per run. A takeover's predecessor may have died before writing the
        catalogue or singerlake.json: both are due (SPEC.md §9)."""
        if not writer.taken:
            writer.take()
            if writer.took_over:
                with self._metadata:
                    self._tap_due = True
                    self._published.pop(writer.stream, None)
        return writer

    def _commits_without_lock(self, job: DrainJob) -> set[str]:
        """Streams of the run's last batch that may commit without a lock (SPEC.md §9): one data commit
        in the run (a single segment, no ACTIVATE_VERSION, a writer not locked by an earlier batch)."""
        chosen = set()
        for stream, items in job.batch.streams.items():
            if len(items) == 1 and isinstance(items[0], Segment):
                writer = self.writers[(stream, items[0].schema.hash)].result()
                if not writer.taken and writer.manifest is not None:
                    chosen.add(stream)
        return chosen

    def _commit_segment(self, writer: SchemaWriter, files: list[dict], last: Manifest | None) -> Manifest:
        """A segment's commit: without the lock when the writer has not taken it (the run's only commit,
        while no lock exists and the catalogue entry stays), else under it."""
        if not writer.taken:
            with self._metadata:
                expected = self._published.get(writer.stream)
            stream_dir = writer.paths.stream_dir
            entry = lambda manifest: cat.catalog_entry(manifest, stream_dir) if manifest.versions else None  # noqa: E731
            try:
                return writer.commit_unlocked(files, entry, expected, last=last)
            except LockNeeded:
                self._take(writer)
        return writer.commit(files, publish=False, last=last)

    def _listed_as_new(self, stream_dir: str) -> bool:
        """Whether the run's listing of the tap, if taken, shows no directory for the stream: it is new,
        and its manifest is created unread (SPEC.md §7)."""
        parent, segment = stream_dir.rsplit("/", 1)
        with self._listing:
            if self._listed is None or segment in self._listed:
                return False
            self._listed.add(segment)  # another schema of the stream finds the manifest this one creates
            return True

    def _is_new_stream(self, stream_dir: str) -> bool:
        """For a stream whose manifest read found none: whether the tap's listing, taken once per run at the
        first such stream (before this run locks any stream it judges new by it), shows no directory for it."""
        parent, segment = stream_dir.rsplit("/", 1)
        with self._listing:
            if self._listed is None:
                self._listed = set(self.lake.storage.list_dirs(f"{parent}/"))
            new = segment not in self._listed
            self._listed.add(segment)
        return new

    def _remember(self, stream: str, manifest: Manifest | None) -> None:
        """Keep the newest manifest of the stream this run has seen (the caller holds ``_metadata``)."""
        known = self._latest.get(stream)
        if manifest is not None and (known is None or manifest.commits >= known.commits or manifest.generation != known.generation):
            self._latest[stream] = manifest

    def _new_writer(self, schema: Any) -> SchemaWriter:
        s = self.settings
        return SchemaWriter(
            self.lake,
            s.tap_id,
            schema.message,
            schema_line=schema.line,
            work_id=s.work_id,
            lease_s=s.lock_lease_s,
            drift_s=s.lock_drift_s,
            wait_s=s.lock_wait_s,
            annotations=s.annotations,
            compresslevel=s.compresslevel,
        )

    def _write(self, segments: list[Segment], here: bool) -> list[list[dict]]:
        """One Spark job for every segment of the batch (or the same work ``here``, SPEC.md §10); each segment's
        file records, in record order."""
        s = self.settings
        jobs = []
        for segment in segments:
            schema = segment.schema
            paths = self.lake.paths(s.tap_id, segment.stream)
            member = gzip_member(schema.line + b"\n", s.compresslevel)
            properties = properties_of(schema.message.get("schema"))
            jobs.append(spark_write.FileJob(self.lake.storage, paths, schema.hash, member, s.max_file_bytes, s.work_id, properties))
        chunks = [segment.chunks for segment in segments]
        for segment in segments:
            segment.chunks = []
        if here:
            return spark_write.write_here(jobs, chunks)
        table = spark_write.batch_table(chunks)
        del chunks  # the table holds the only copy now
        if getattr(self.spark, "started", lambda: True)() is None:
            spark_write.preload_spark_imports()  # Spark is still starting: load meanwhile what its first job would import
        spark = self.spark()
        spark_write.label_jobs(spark, self.job_group(self._batches + 1), f"{len(segments)} segment(s), {table.num_rows} chunk(s)")
        return spark_write.write_with_spark(spark, jobs, table)

    def _confirm_stored(self, files: list[dict]) -> None:
        """Executors elsewhere (a cluster) must have written where the driver will look: check every
        file's size in the lake's storage before any commit names it (SPEC.md §10)."""
        for problem in self._pool.map(self._stored_problem, files):
            if problem:
                raise LandingError(
                    f"{problem}: the executors wrote somewhere the driver cannot see; nothing of this batch was committed "
                    "(is lake_root really shared with every executor?)"
                )

    def _stored_problem(self, file: dict) -> str | None:
        found = next((info for info in self.lake.storage.list(file["path"]) if info.key == file["path"]), None)
        if found is None:
            return f"data file {file['path']}, reported written by an executor, is not in the lake's storage"
        if found.size != file["size"]:
            return f"data file {file['path']} has {found.size} bytes in the lake's storage, the executor reported {file['size']}"
        return None

    def job_group(self, batch: int) -> str:
        """The Spark job group of a batch's job: unique per run, so the UI and status tracker tell runs apart."""
        return f"{self.settings.work_id or 'target-singerlake'} batch {batch}"

    def _commit_stream(
        self, stream: str, items: list[Segment | ActivateVersion], files_of: dict[int, list[dict]], final: bool = False
    ) -> Manifest | None:
        """One stream's segments and marks, in arrival order; returns its manifest after the last commit.

        Each commit starts from the stream's manifest as this run last saw it (one conditional write
        when nobody else wrote since). A commit that changed the stream's catalogue entry leaves it to
        ``_publish``. ``final``: then the stream's locks are released at once, beside other streams'
        commits, unless its entry is still to be written (``_run`` releases those after ``_publish``).
        """
        manifest = None
        for item in items:
            last = self._latest.get(stream)
            if isinstance(item, Segment):
                manifest = self._commit_segment(self.writers[(stream, item.schema.hash)].result(), files_of[id(item)], last)
            else:
                manifest = self._record_activation(stream, item, last)
            with self._metadata:
                self._remember(stream, manifest)
            self._unmarked.add(stream)
        if manifest is not None and manifest.versions:
            entry = cat.catalog_entry(manifest, self.lake.paths(manifest.tap_id, manifest.stream).stream_dir)
            with self._metadata:
                if self._published.get(stream) != entry:
                    self._unpublished[stream] = entry
        if final and stream not in self._unpublished:
            with self._writers_lock:
                mine = [future for (name, _), future in self.writers.items() if name == stream]
            for future in mine:
                if future.done() and future.exception() is None and (outcome := _release(future.result())) is not None:
                    log.warning("could not release %s: %s", future.result().lock.key, outcome)
        return manifest

    def _release(self, streams) -> None:
        """Release, side by side, the locks still held of ``streams`` whose catalogue entries are written."""
        with self._writers_lock:
            held = [
                future.result()
                for (stream, _), future in self.writers.items()
                if stream in streams and future.done() and future.exception() is None and future.result().lock.held
            ]
        held = [writer for writer in held if writer.stream not in self._unpublished]
        for writer, outcome in zip(held, self._pool.map(_release, held), strict=True):
            if outcome is not None:
                log.warning("could not release %s: %s", writer.lock.key, outcome)

    def _record_activation(self, stream: str, item: ActivateVersion, last: Manifest | None = None) -> Manifest:
        def change(manifest: Manifest) -> None:
            manifest.add_activation(item.version, iso_ms(item.received_ms))

        paths = self.lake.paths(self.settings.tap_id, stream)
        return update_manifest(self.lake.storage, paths, change, seed=lambda: scan_stream(self.lake.storage, paths), last=last)

    def _publish(self) -> None:
        """The catalogue entries this run's commits changed, in one update; ``singerlake.json`` when due."""
        with self._metadata:
            entries = list(self._unpublished.values())
        if entries:
            self.lake.publish_catalogue(self.settings.tap_id, entries)
            with self._metadata:
                for entry in entries:
                    stream = entry["tap_stream_id"]
                    self._published[stream] = entry
                    if self._unpublished.get(stream) == entry:
                        del self._unpublished[stream]
        if self._tap_due and self._published:
            self.lake.register_tap(self.settings.tap_id, self.settings.annotations)
            self._tap_due = False

    def _report(self, records: int, streams: int, files: int, started: float, written: float, here: bool) -> None:
        self._batches += 1
        self._records += records
        elapsed = time.monotonic() - self._started
        jobs = spark_write.jobs_in_group(self.spark(), self.job_group(self._batches)) if files and not here else 0
        log.info(
            "batch %d: %d records of %d stream(s) in %d file(s) %s: written in %.2fs, committed in %.2fs; %s records so far (%s/s)",
            self._batches,
            records,
            streams,
            files,
            "in this process" if here else f"by {'?' if jobs is None else jobs} Spark job(s)",
            written - started,
            time.monotonic() - written,
            f"{self._records:,}",
            f"{self._records / elapsed:,.0f}" if elapsed > 0 else "-",
        )


def _release(writer: SchemaWriter) -> Exception | None:
    try:
        writer.close()
    except Exception as exc:
        return exc
    return None
