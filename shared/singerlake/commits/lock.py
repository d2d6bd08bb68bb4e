"""Stream-schema lock files with leases (SPEC.md §8).

A lock is a tiny JSON object created with a create-only write. Its holder refreshes it while it
works; a waiter takes it over only when ``refreshed`` is older than the lease plus a clock-drift
margin, replacing exactly the version it judged stale (If-Match). Every acquisition uses a fresh
writer id, so an id that lost a lock is never used again. Ids are UUIDv7s, drawn above the ids the
acquirer knows of (the registered writer's, a stale holder's), so a later acquisition mostly has a
greater id; the fence of SPEC.md §9 compares them, and a holder proves itself by ``renew_id`` where
they mislead.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone

from singerlake.commits.errors import LockLost, LockTimeout
from singerlake.storage import NotFound, PreconditionFailed, Storage
from singerlake.times import file_id_ms, iso_ms, new_file_id, now_ms, to_ms

log = logging.getLogger(__name__)

DEFAULT_LEASE_S = 60.0
DEFAULT_DRIFT_S = 10.0
DEFAULT_WAIT_S = 600.0


@dataclass(frozen=True)
class LockInfo:
    writer_id: str
    acquired_ms: int
    refreshed_ms: int
    lease_s: float

    @classmethod
    def parse(cls, data: bytes) -> LockInfo | None:
        try:
            doc = json.loads(data)
            return cls(
                doc["writer-id"],
                _parse_iso(doc["acquired"]),
                _parse_iso(doc["refreshed"]),
                float(doc.get("lease_seconds", DEFAULT_LEASE_S)),
            )
        except (ValueError, KeyError, TypeError):
            return None


def _parse_iso(text: str) -> int:
    return to_ms(datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(timezone.utc))


def new_writer_id(prefix: str = "writer", *after: str | None) -> str:
    """``<prefix>-<UUIDv7 hex>``: ordered by the time it is drawn, and above every id of ``after`` of this
    form (a registered writer, a stale holder; SPEC.md §8-§9) even when this clock lags behind theirs."""
    floors = [ms for ms in (writer_id_ms(other) for other in after if other) if ms is not None]
    created = max([now_ms(), *(ms + 1 for ms in floors)])
    return f"{prefix}-{new_file_id(created)}"


def writer_id_ms(writer_id: str) -> int | None:
    """The creation time of a writer id drawn by ``new_writer_id``; None for any other id (older
    writers drew random ids)."""
    _, _, hexid = writer_id.rpartition("-")
    if len(hexid) != 32 or hexid[12] != "7" or hexid.strip("0123456789abcdef"):
        return None
    return file_id_ms(hexid)


def writer_id_key(writer_id: str) -> str | None:
    """What orders two ids of ``new_writer_id``: their UUIDv7s (the prefix says nothing of time)."""
    return writer_id.rpartition("-")[2] if writer_id_ms(writer_id) is not None else None


def _body(writer_id: str, acquired_ms: int, refreshed_ms: int, lease_s: float) -> bytes:
    doc = {"writer-id": writer_id, "acquired": iso_ms(acquired_ms), "refreshed": iso_ms(refreshed_ms), "lease_seconds": lease_s}
    return json.dumps(doc, separators=(",", ":")).encode()


class Lock:
    """One holder at a time for ``key``; use as a context manager or acquire()/release()."""

    def __init__(
        self,
        storage: Storage,
        key: str,
        *,
        lease_s: float = DEFAULT_LEASE_S,
        drift_s: float = DEFAULT_DRIFT_S,
        wait_s: float = DEFAULT_WAIT_S,
        poll_s: float = 0.5,
        writer_prefix: str = "writer",
        heartbeat: bool = True,
    ):
        self.storage, self.key = storage, key
        self.lease_s, self.drift_s, self.wait_s, self.poll_s = lease_s, drift_s, wait_s, poll_s
        self.writer_prefix = writer_prefix
        self.heartbeat = heartbeat
        self.writer_id: str | None = None
        self.took_over = False  # the last acquisition replaced a stale lock: its holder may have died mid-work
        self._etag: str | None = None
        self._acquired_ms = 0
        self._lost = threading.Event()
        self._stop = threading.Event()
        self._held = 0  # acquisitions so far: the heartbeat's entries of an earlier one are dropped
        self._io = threading.Lock()

    # -- acquiring -------------------------------------------------------------------------
    def is_stale(self, info: LockInfo | None, observed_since: float) -> bool:
        """Stale: not refreshed for lease + drift. An unreadable lock counts from when we first saw it."""
        margin_ms = (max(self.lease_s, info.lease_s if info else 0) + self.drift_s) * 1000
        if info is None:
            return (time.monotonic() - observed_since) * 1000 > margin_ms
        return now_ms() - info.refreshed_ms > margin_ms

    def acquire(self, after: str | None = None) -> Lock:
        """Take the lock: one create-only write when it is free. ``after``: a writer id the new one
        must sort above (the stream-schema's registered writer, read before, SPEC.md §9); a takeover's
        id also sorts above the stale holder's."""
        if self._etag is not None:
            raise RuntimeError(f"{self.key}: already held by this object")
        deadline = time.monotonic() + self.wait_s
        seen_etag, seen_since = None, time.monotonic()
        holder = None
        while True:
            took_over = False
            # Drawn for each attempt: the id of the write that wins is as late as the acquisition itself.
            writer_id = new_writer_id(self.writer_prefix, after)
            stamp = now_ms()
            body = _body(writer_id, stamp, stamp, self.lease_s)
            try:
                # Create-only: the storage lets exactly one of racing writers create the key, so
                # success alone proves the lock is ours (SPEC.md §8); nothing needs reading back.
                etag = self.storage.write(self.key, body, if_none_match=True, durable=False)
            except PreconditionFailed:
                try:
                    current = self.storage.read(self.key)
                except NotFound:
                    continue  # released meanwhile: try again at once
                if current.etag != seen_etag:
                    seen_etag, seen_since = current.etag, time.monotonic()
                info = LockInfo.parse(current.data)
                holder = info.writer_id if info else "<unreadable lock>"
                if not self.is_stale(info, seen_since):
                    if time.monotonic() > deadline:
                        raise LockTimeout(f"{self.storage.url_of(self.key)} is held by {holder}; waited {self.wait_s:.0f}s") from None
                    time.sleep(self.poll_s)
                    continue
                writer_id = new_writer_id(self.writer_prefix, after, info.writer_id if info else None)
                body = _body(writer_id, stamp, stamp, self.lease_s)
                try:
                    # Replaces exactly the version judged stale: losing to another taker or a late refresh fails here.
                    etag = self.storage.write(self.key, body, if_match=current.etag, durable=False)
                except PreconditionFailed:
                    continue  # someone else refreshed or took it over first
                log.warning("took over stale lock %s from %s", self.storage.url_of(self.key), holder)
                took_over = True
            self.writer_id, self._etag, self._acquired_ms, self.took_over = writer_id, etag, stamp, took_over
            self._lost.clear()
            self._stop.clear()
            self._held += 1
            if self.heartbeat:
                _HEARTBEAT.add(self, self._held)
            return self

    def absent(self) -> bool:
        """Whether no writer holds or left the lock now, by one existence check (for a commit made without it, SPEC.md §9)."""
        return not self.storage.exists(self.key)

    # -- holding ---------------------------------------------------------------------------
    def refresh(self) -> None:
        """Extend the lease; raises LockLost when another writer has taken the lock."""
        with self._io:
            if self._lost.is_set() or self._etag is None:
                raise LockLost(f"{self.key}: {self.writer_id} no longer holds this lock")
            body = _body(self.writer_id, self._acquired_ms, now_ms(), self.lease_s)
            try:
                self._etag = self.storage.write(self.key, body, if_match=self._etag, durable=False)
            except PreconditionFailed:
                self._lost.set()
                raise LockLost(f"{self.storage.url_of(self.key)}: lock of {self.writer_id} was taken over") from None

    def renew_id(self, above: str) -> str:
        """Prove this lock is still held, and sort above ``above``: rewrite it, conditionally on the
        version written last, under a new writer id above that one (SPEC.md §9). Raises LockLost when
        another writer took the lock. Counts as a refresh."""
        with self._io:
            if self._lost.is_set() or self._etag is None:
                raise LockLost(f"{self.key}: {self.writer_id} no longer holds this lock")
            writer_id = new_writer_id(self.writer_prefix, above, self.writer_id)
            body = _body(writer_id, self._acquired_ms, now_ms(), self.lease_s)
            try:
                self._etag = self.storage.write(self.key, body, if_match=self._etag, durable=False)
            except PreconditionFailed:
                self._lost.set()
                raise LockLost(f"{self.storage.url_of(self.key)}: lock of {self.writer_id} was taken over") from None
            self.writer_id = writer_id
            return writer_id

    def _beat(self) -> bool:
        """One heartbeat: refresh the lease; returns whether to go on beating."""
        if self._stop.is_set():
            return False
        try:
            self.refresh()
        except LockLost as exc:
            if not self._stop.is_set():  # else released meanwhile: nothing was lost
                log.error("%s", exc)
            return False
        except Exception as exc:  # transient storage trouble: keep trying until the lease ends
            log.warning("could not refresh %s: %s", self.key, exc)
        return True

    @property
    def held(self) -> bool:
        """Acquired, and neither released, abandoned nor known to be lost."""
        return self._etag is not None and not self._lost.is_set()

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def check(self) -> None:
        if self.lost:
            raise LockLost(f"{self.storage.url_of(self.key)}: lock of {self.writer_id} was taken over")
        if self._etag is None:
            raise LockLost(f"{self.storage.url_of(self.key)}: not held (released, or never acquired)")

    # -- releasing -------------------------------------------------------------------------
    def release(self) -> bool:
        """Delete the lock only if it is still ours; returns whether it was."""
        self._stop.set()  # the heartbeat drops it; a refresh under way finishes first (self._io)
        with self._io:
            etag, self._etag = self._etag, None
            if etag is None or self._lost.is_set():
                return False
            try:
                self.storage.delete(self.key, if_match=etag)
                return True
            except PreconditionFailed:
                log.warning("%s was taken over before release; left to its new owner", self.key)
                self._lost.set()
                return False

    def abandon(self) -> None:
        """Stop refreshing without deleting: the lock goes stale after its lease, and the next writer
        takes it over knowing that this one did not finish (SPEC.md §9)."""
        self._stop.set()
        with self._io:
            self._etag = None

    def __enter__(self) -> Lock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class _Heartbeat:
    """Refreshes every lock this process holds, each every lease/3: one thread that keeps the
    schedule, refreshes on a few threads (a thread per lock would cost a thread per stream)."""

    def __init__(self, threads: int = 8):
        self._due: list[tuple[float, int, Lock, int]] = []  # (when, tie-break, lock, its acquisition)
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._threads = threads
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None

    def add(self, lock: Lock, held: int) -> None:
        with self._wake:
            heapq.heappush(self._due, (time.monotonic() + lock.lease_s / 3, next(self._order), lock, held))
            if self._thread is None or not self._thread.is_alive():  # first use (or a forked child)
                self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="singerlake-lock-refresh")
                self._thread = threading.Thread(target=self._run, name="singerlake-lock-heartbeat", daemon=True)
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while True:
                    while self._due and self._gone(*self._due[0][2:]):
                        heapq.heappop(self._due)
                    wait = self._due[0][0] - time.monotonic() if self._due else None
                    if wait is not None and wait <= 0:
                        break
                    self._wake.wait(wait)
                _, _, lock, held = heapq.heappop(self._due)
                pool = self._pool
            try:
                pool.submit(self._beat, lock, held)
            except RuntimeError:  # the interpreter is shutting down: nobody is left to hold a lock for
                return

    @staticmethod
    def _gone(lock: Lock, held: int) -> bool:
        return lock._stop.is_set() or lock._held != held

    def _beat(self, lock: Lock, held: int) -> None:
        if not self._gone(lock, held) and lock._beat():
            self.add(lock, held)


_HEARTBEAT = _Heartbeat()


def looks_stale(info: LockInfo | None, now: int, drift_s: float = DEFAULT_DRIFT_S) -> bool:
    """For reports (verify, locks): unreadable, or not refreshed for its lease plus the drift margin."""
    return info is None or now - info.refreshed_ms > (info.lease_s + drift_s) * 1000


def read_lock(storage: Storage, key: str) -> LockInfo | None:
    try:
        return LockInfo.parse(storage.read(key).data)
    except NotFound:
        return None
