"""A push's lease and a vacuum's lock over one what (SPEC.md §15).

A push holds ``pending/<txn>`` (a lock of §8, so it is refreshed while the push works) from before
it stores or finds stored any bytes until its segment is written; right after taking it, it waits
out a live vacuum of the what. Vacuum, holding ``vacuum.lock``, thus either sees the lease or is
seen by the push: nothing a push may still commit is deleted under it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from singerlake.commits.errors import LockTimeout
from singerlake.commits.lock import DEFAULT_WAIT_S, Lock, LockInfo, looks_stale
from singerlake.files import layout
from singerlake.storage import NotFound, PreconditionFailed, Storage
from singerlake.times import now_ms


@contextmanager
def push_leases(storage: Storage, what: str, txns: list[str], wait_s: float = DEFAULT_WAIT_S) -> Iterator[dict[str, Lock]]:
    """Hold a lease for each of ``txns``, once no live vacuum works on ``what``; released on exit."""
    with ExitStack() as stack:
        leases = {txn: stack.enter_context(Lock(storage, layout.pending_key(what, txn), writer_prefix="push")) for txn in txns}
        wait_for_vacuum(storage, what, wait_s)
        yield leases


def wait_for_vacuum(storage: Storage, what: str, wait_s: float = DEFAULT_WAIT_S, poll_s: float = 0.25) -> None:
    """Return once the vacuum that held ``vacuum.lock`` of ``what`` when the lease was already taken is
    done with it. A vacuum that takes the lock later lists the leases after that and sees this one, so
    only the holder seen first is waited for: a vacuum in a loop cannot starve a push. A stale lock (its
    vacuum died or stalled) is deleted, conditionally on the version judged stale, so that vacuum's
    next refresh fails."""
    key = layout.vacuum_lock_key(what)
    deadline = time.monotonic() + wait_s
    first = None
    while True:
        try:
            current = storage.read(key)
        except NotFound:
            return
        info = LockInfo.parse(current.data)
        holder = info.writer_id if info else current.etag
        first = first or holder
        if holder != first:
            return  # another vacuum's pass, begun after the lease existed
        if looks_stale(info, now_ms()):
            try:
                storage.delete(key, if_match=current.etag)
            except PreconditionFailed:
                pass  # refreshed or released meanwhile: look again
            continue
        if time.monotonic() > deadline:
            raise LockTimeout(f"{storage.url_of(key)} is held by {holder}; waited {wait_s:.0f}s for the vacuum to finish")
        time.sleep(poll_s)
