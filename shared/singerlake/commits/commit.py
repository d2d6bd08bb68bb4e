"""Atomic commits: compare-and-swap on a metadata object, retried on conflict (SPEC.md §9)."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable

from singerlake.commits.errors import CommitConflict, CommitRejected, Overtaken
from singerlake.commits.lock import writer_id_key
from singerlake.format.layout import StreamPaths
from singerlake.format.manifest import Manifest
from singerlake.format.parts import PartStore
from singerlake.storage import Blob, NotFound, PreconditionFailed, Storage
from singerlake.text import counted
from singerlake.times import file_id_ms, iso_ms, now_ms


def compare_and_swap(
    storage: Storage,
    key: str,
    change: Callable[[bytes | None], bytes | None],
    *,
    timeout_s: float = 300.0,
    durable: bool = True,
    known: Blob | None = None,
    absent: bool = False,
) -> Blob | None:
    """Read ``key``, compute its new bytes with ``change`` (None: leave as is), write only if unchanged.

    On a lost race the object is re-read and ``change`` runs again, so concurrent updates compose.
    ``known``: the object as this process last wrote it; the first attempt starts from it without
    reading, so when nobody wrote since, the whole swap is one conditional write. ``absent``: the
    caller knows the object does not exist yet; the first attempt is a create-only write, unread.
    Returns the object as written (or as found, when unchanged; None when it does not exist).
    """
    deadline = time.monotonic() + timeout_s
    attempt = 0
    while True:
        if known is not None:
            current, etag, known = known.data, known.etag, None
        elif absent:
            current, etag, absent = None, None, False
        else:
            try:
                blob = storage.read(key)
                current, etag = blob.data, blob.etag
            except NotFound:
                current, etag = None, None
        new = change(current)
        if new is None:
            return None if current is None else Blob(current, etag)
        try:
            if etag is None:  # a creation is durable, whatever was asked: a first manifest precedes its data files on disk too (SPEC.md §7)
                written = storage.write(key, new, if_none_match=True)
            else:
                written = storage.write(key, new, if_match=etag, durable=durable)
            return Blob(new, written)
        except PreconditionFailed:
            attempt += 1
            if time.monotonic() > deadline:
                raise CommitConflict(f"{storage.url_of(key)}: gave up after {attempt} conflicting attempts") from None
            time.sleep(random.uniform(0, min(1.0, 0.005 * 2 ** min(attempt, 8))))


def update_manifest(
    storage: Storage,
    paths: StreamPaths,
    change: Callable[[Manifest], bool | None],
    *,
    seed: Callable[[], Manifest] | None = None,
    durable: bool = True,
    known: Blob | None = None,
    store: PartStore | None = None,
    last: Manifest | None = None,
    absent: bool = False,
    missing: bool = False,
) -> Manifest:
    """Apply ``change`` to the stream's manifest atomically; ``change`` returning False writes nothing.

    ``seed`` builds the manifest when none exists yet (a rebuild from a scan, so that creating a
    manifest never hides data files already on storage). ``absent``: the caller knows the stream
    has no object at all (SPEC.md §7): the first attempt creates the manifest (create-only) without
    reading it or seeding it; should another writer have created it meanwhile, that write fails and
    the swap goes on as usual. ``missing``: the caller has just read it and found none: the first
    attempt creates it (create-only, seeded as usual) without reading it again. ``known``: the ``stored`` of the manifest
    this writer wrote last (see ``compare_and_swap``). ``store``: the stream's parts as already read
    (parts never change). ``last``: the manifest this writer wrote last; its root is then neither
    read nor parsed again unless someone else wrote since. A tail grown past its bound is sealed
    into a part, written before the root (SPEC.md §5, §9). The result's ``stored`` is what is on
    storage now.
    """
    source = storage.url_of(paths.manifest)
    if last is not None and last.stored is not None:
        known, store = last.stored, store or last.store
    store = store or PartStore(storage, paths)
    seeded: list[Manifest] = []
    result: list[Manifest] = []
    unread = [absent]  # the first attempt of an ``absent`` swap: nothing to scan

    def apply(current: bytes | None) -> bytes | None:
        assumed_new, unread[0] = unread[0], False
        if current is not None and last is not None and last.stored is not None and current is last.stored.data:
            manifest = last.copy()  # the root as this process wrote it
        elif current is not None:
            manifest = Manifest.from_bytes(current, source, store)
        else:
            if seed is not None and not seeded and not assumed_new:
                seeded.append(seed())
            manifest = Manifest.from_dict(seeded[0].to_dict(), source, store) if seeded else Manifest(paths.tap_id, paths.stream)
            manifest.store = store
            if not manifest.generation:
                manifest.start_generation()
        result[:] = [manifest]
        if change(manifest) is False and current is not None:
            return None
        return sealed_bytes(manifest)

    unread_first = (absent or missing) and known is None
    result[0].stored = compare_and_swap(storage, paths.manifest, apply, durable=durable, known=known, absent=unread_first)
    return result[0]


def sealed_bytes(manifest: Manifest) -> bytes:
    """The root to write: the tail sealed if it outgrew its bound, and every new part written first."""
    manifest.seal()
    check_horizon(manifest, manifest.staged_part_ids(), "manifest part")
    manifest.write_parts()
    return manifest.to_bytes()


def check_horizon(manifest: Manifest, ids, kind: str) -> None:
    """Refuse to name new objects whose ids vacuum may have deleted as orphans (SPEC.md §15)."""
    below = manifest.below_horizon(ids)
    if below:
        raise CommitRejected(
            f"{manifest.stream!r}: {counted(len(below), kind)} written before a vacuum deleted orphans up to {manifest.vacuumed} "
            f"(e.g. {below[0]}); nothing was committed, run again"
        )


def write_manifest(storage: Storage, paths: StreamPaths, manifest: Manifest) -> Manifest:
    """Replace the stream's manifest with ``manifest`` (a rebuild, an upgrade), parts first. The root it
    replaces keeps its horizon (SPEC.md §15): its ``vacuumed`` is carried over, and the parts written
    here are refused if a vacuum raised it above them meanwhile."""
    manifest.store = manifest.store or PartStore(storage, paths)
    manifest.seal()
    written = manifest.staged_part_ids()
    manifest.write_parts()

    def change(current: bytes | None) -> bytes | None:
        manifest.vacuumed = max(filter(None, [manifest.vacuumed, _horizon_of(current)]), default=None)
        check_horizon(manifest, written, "manifest part")
        data = manifest.to_bytes()
        return None if current == data else data

    manifest.stored = compare_and_swap(storage, paths.manifest, change)
    return manifest


def _horizon_of(root: bytes | None) -> str | None:
    """The ``vacuumed`` of a root that may be invalid (a rebuild replaces such roots)."""
    try:
        doc = json.loads(root) if root else None
    except ValueError:
        return None
    found = doc.get("vacuumed") if isinstance(doc, dict) else None
    return found if isinstance(found, str) else None


def register_writer(storage: Storage, paths: StreamPaths, schema_hash: str, writer_id: str, **kwargs) -> Manifest:
    """Make ``writer_id`` the registered writer of this stream-schema at once, whoever was before.

    Landing registers in its first commit instead (``commit_many``, SPEC.md §9); this eager form
    remains for tools and tests that play a writer who took a lock over. The fence only concerns
    live writers, so this write need not survive a power failure; commits do.
    """

    def change(manifest: Manifest) -> None:
        manifest.writers[schema_hash] = {"writer_id": writer_id, "since": iso_ms(now_ms())}

    return update_manifest(storage, paths, change, durable=False, **kwargs)


def claim_writer(manifest: Manifest, schema_hash: str, writer_id: str, proven_over: str | None = None) -> bool:
    """The fence (SPEC.md §9), inside a swap: ``writer_id`` may write to this stream-schema when it is the
    registered writer, or when none is registered or the registered one's id is smaller (then it
    becomes the registered writer: returns True). ``proven_over``: a registered id this writer found
    above its own, after which it proved it still holds its lock: it replaces that one too.
    Otherwise Overtaken, naming the registered writer."""
    entry = manifest.writers.get(schema_hash) or {}
    owner = entry.get("writer_id")
    if owner == writer_id:
        return False
    if owner is None or owner == proven_over or is_before(owner, writer_id):
        manifest.writers[schema_hash] = {"writer_id": writer_id, "since": iso_ms(now_ms())}
        return True
    raise Overtaken(f"{manifest.stream!r} schema {schema_hash}: writer {writer_id} lost its lock to {owner}", owner)


def is_before(owner: str, writer_id: str) -> bool:
    """Whether writer id ``owner`` sorts below ``writer_id``: both UUIDv7s drawn by ``new_writer_id`` (ids
    of writers before 2.2's fence were random: they sort below nothing)."""
    theirs, mine = writer_id_key(owner) if isinstance(owner, str) else None, writer_id_key(writer_id)
    return theirs is not None and mine is not None and theirs < mine


def commit_files(
    storage: Storage,
    paths: StreamPaths,
    records: list[dict],
    schemas: dict[str, tuple[dict, list[str]]],
    *,
    writer_id: str | None = None,
    known: Blob | None = None,
    last: Manifest | None = None,
    proven_over: str | None = None,
    check: Callable[[Manifest], None] | None = None,
) -> Manifest:
    """Make data files visible: all of ``records`` in one new commit, or none of them.

    ``schemas`` maps each schema hash used by ``records`` to (schema, key_properties). With
    ``writer_id`` the commit is fenced (``claim_writer``): it registers that writer for every
    stream-schema it touches, or fails with Overtaken (a CommitRejected) naming the registered writer.
    Files the manifest already holds are skipped, so a retried commit changes nothing, fenced or not.
    ``check``: called inside each attempt with the manifest as the commit leaves it, before the root is
    written; whatever it raises aborts the commit with nothing written.
    """
    return commit_many(
        storage, paths, [records], schemas, writer_id=writer_id, known=known, last=last, proven_over=proven_over, check=check
    )


def commit_many(
    storage: Storage,
    paths: StreamPaths,
    batches: list[list[dict]],
    schemas: dict[str, tuple[dict, list[str]]],
    *,
    writer_id: str | None = None,
    known: Blob | None = None,
    last: Manifest | None = None,
    proven_over: str | None = None,
    check: Callable[[Manifest], None] | None = None,
) -> Manifest:
    """Each batch of ``batches`` as its own commit, in order, all in one write of the root (a backfill,
    a benchmark). The manifest is exactly what committing the batches one by one would leave: each
    commit is followed by the same seal check (parts are written as they are sealed)."""
    missing = {r["schema_hash"] for batch in batches for r in batch} - set(schemas)
    if missing:
        raise ValueError(f"no schema given for schema hashes {sorted(missing)}")

    def change(manifest: Manifest) -> bool:
        present = manifest.present_ids({r["id"] for batch in batches for r in batch})
        fresh = [[r for r in records if r["id"] not in present] for records in batches]
        if not any(fresh):
            return False  # all committed already (a retry): nothing to fence, nothing to write
        if writer_id is not None:
            try:
                for schema_hash in sorted({r["schema_hash"] for records in fresh for r in records}):
                    claim_writer(manifest, schema_hash, writer_id, proven_over)
            except Overtaken as exc:
                raise Overtaken(f"{exc}; {counted(sum(map(len, fresh)), 'file')} left uncommitted", exc.owner) from None
        fresh = [records for records in fresh if records]
        for index, new in enumerate(fresh):
            check_horizon(manifest, [r["id"] for r in new], "data file")
            for record in sorted(new, key=lambda r: r["id"]):
                schema, keys = schemas[record["schema_hash"]]
                manifest.add_version(record["schema_hash"], schema, keys, file_id_ms(record["id"]))
            manifest.append_commit(new)
            if index < len(fresh) - 1:  # the last commit's seal happens as the root is written
                manifest.seal()
                manifest.write_parts()
        if check is not None:
            check(manifest)
        return True

    return update_manifest(storage, paths, change, known=known, last=last)
