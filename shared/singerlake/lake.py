"""The lake as readers and writers see it: names, metadata with scan fallbacks, and updates."""

from __future__ import annotations

from typing import Any, BinaryIO

from singerlake.commits.commit import compare_and_swap, update_manifest
from singerlake.errors import BadArgument, ConfigError, SingerlakeError
from singerlake.files.layout import FILES
from singerlake.format import catalogue as cat
from singerlake.format.layout import NAME_FILE, RAW, ROOT_METADATA, StreamPaths, catalogue_key, tap_dir
from singerlake.format.manifest import Manifest
from singerlake.format.names import decode_segment, is_truncated, normalise_label
from singerlake.format.parts import PartStore
from singerlake.format.scan import scan_stream
from singerlake.storage import NotFound, PreconditionFailed, Storage, open_storage
from singerlake.times import iso_ms


class UnknownTap(SingerlakeError, LookupError):
    pass


class LakeNotFound(SingerlakeError, LookupError):
    pass


class Lake:
    def __init__(self, storage: Storage):
        self.storage = storage

    @classmethod
    def open(cls, root: str | None = None, **s3_options) -> Lake:
        return cls(open_storage(root, **s3_options))

    def check_exists(self) -> None:
        """Readers call this first: a mistyped root is an error, not an empty lake."""
        if not self.storage.root_exists():
            raise LakeNotFound(f"lake root {self.storage.url} does not exist")

    def check_is_lake(self) -> None:
        """For the lake jobs: any directory exists, but only a lake holds landed data (raw/) or pushed files (files/)."""
        self.check_exists()
        if not {RAW, FILES} & set(self.storage.list_dirs("")):
            raise LakeNotFound(
                f"lake root {self.storage.url} holds no lake: it has no {RAW}/ or {FILES}/ (nothing was ever landed or pushed there)"
            )

    def paths(self, tap_id: str, stream: str) -> StreamPaths:
        return StreamPaths(tap_id, stream)

    # -- names -------------------------------------------------------------------------------
    def _name_of(self, parent: str, segment: str) -> str:
        if is_truncated(segment):
            return self.storage.read(f"{parent}/{segment}/{NAME_FILE}").data.decode("utf-8")
        return decode_segment(segment)

    def ensure_names(self, paths: StreamPaths) -> None:
        """Keep the full name beside any segment that had to be truncated."""
        for directory, name in ((paths.tap_dir, paths.tap_id), (paths.stream_dir, paths.stream)):
            if is_truncated(directory.rsplit("/", 1)[1]):
                try:
                    self.storage.write(f"{directory}/{NAME_FILE}", name.encode("utf-8"), if_none_match=True)
                except PreconditionFailed:
                    pass  # already there, written by an earlier writer

    def listed_taps(self) -> list[str]:
        return sorted(self._name_of(RAW, segment) for segment in self.storage.list_dirs(f"{RAW}/"))

    def listed_streams(self, tap_id: str) -> list[str]:
        parent = tap_dir(tap_id)
        return sorted(self._name_of(parent, segment) for segment in self.storage.list_dirs(f"{parent}/"))

    # -- reading, with fallbacks ---------------------------------------------------------------
    def root_metadata(self) -> dict[str, Any]:
        try:
            return cat.load(self.storage.read(ROOT_METADATA).data, self.storage.url_of(ROOT_METADATA), "root")
        except NotFound:
            return self.rebuild_root_metadata()

    def rebuild_root_metadata(self, keep: dict | None = None) -> dict[str, Any]:
        root = keep or cat.empty_root()
        for tap_id in self.listed_taps():
            root = cat.upsert_tap(root, tap_id, tap_dir(tap_id))
        return root

    def taps(self) -> list[str]:
        return sorted(self.root_metadata()["taps"])

    def check_tap(self, tap_id: str) -> None:
        taps = self.taps()
        if tap_id not in taps:
            raise UnknownTap(f"tap {tap_id!r} is not in the lake at {self.storage.url}; taps present: {taps or 'none'}")

    def manifest(self, tap_id: str, stream: str) -> Manifest:
        """The stream's manifest (its root read; parts are read when a caller needs them), or a scan."""
        paths = self.paths(tap_id, stream)
        store = PartStore(self.storage, paths)
        try:
            return Manifest.from_bytes(self.storage.read(paths.manifest).data, self.storage.url_of(paths.manifest), store)
        except NotFound:
            manifest = scan_stream(self.storage, paths)
            manifest.store = store
            return manifest

    def catalogue(self, tap_id: str) -> dict[str, Any]:
        key = catalogue_key(tap_id)
        try:
            return cat.load(self.storage.read(key).data, self.storage.url_of(key), "catalogue")
        except NotFound:
            return self.rebuild_catalogue(tap_id)

    def rebuild_catalogue(self, tap_id: str, known: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
        """The catalogue the manifests give; ``known`` entries (by stream) are taken as they are, unread."""
        known = known or {}
        entries = []
        for stream in self.listed_streams(tap_id):
            if stream in known:
                entries.append(known[stream])
                continue
            manifest = self.manifest(tap_id, stream)
            if manifest.versions:
                entries.append(cat.catalog_entry(manifest, self.paths(tap_id, stream).stream_dir))
        return cat.upsert_streams({"streams": []}, entries)

    def streams(self, tap_id: str) -> list[str]:
        return [entry["tap_stream_id"] for entry in self.catalogue(tap_id)["streams"]]

    # -- writing derived metadata ----------------------------------------------------------------
    def publish_stream(self, manifest: Manifest, annotations: dict[str, Any] | None = None) -> None:
        """Bring catalogue.json and singerlake.json up to date with a committed manifest."""
        entry = cat.catalog_entry(manifest, self.paths(manifest.tap_id, manifest.stream).stream_dir)
        self.publish_catalogue(manifest.tap_id, [entry])
        self.register_tap(manifest.tap_id, annotations)

    def publish_catalogue(self, tap_id: str, entries: list[dict[str, Any]]) -> None:
        """Upsert catalog entries into the tap's catalogue.json in one compare-and-swap (no write when unchanged)."""
        key = catalogue_key(tap_id)

        def change_catalogue(current: bytes | None) -> bytes | None:
            if current is None:  # a new tap, or a lost catalogue: the other streams' manifests say the rest
                base = self.rebuild_catalogue(tap_id, known={entry["tap_stream_id"]: entry for entry in entries})
            else:
                base = cat.load(current, self.storage.url_of(key), "catalogue")
            updated = cat.upsert_streams(base, entries)
            return None if current is not None and updated == base else cat.dump(updated)

        compare_and_swap(self.storage, key, change_catalogue)

    def register_tap(self, tap_id: str, annotations: dict[str, Any] | None = None) -> None:
        tap_path = tap_dir(tap_id)

        def change_root(current: bytes | None) -> bytes | None:
            base = self.rebuild_root_metadata() if current is None else cat.load(current, ROOT_METADATA, "root")
            updated = cat.upsert_tap(base, tap_id, tap_path, annotations)
            return None if current is not None and updated == base else cat.dump(updated)

        compare_and_swap(self.storage, ROOT_METADATA, change_root)

    def update_manifest(self, paths: StreamPaths, change, store: PartStore | None = None) -> Manifest:
        """Manifest CAS that first rebuilds from a scan when no manifest exists yet."""
        return update_manifest(self.storage, paths, change, seed=lambda: scan_stream(self.storage, paths), store=store)

    # -- any file (SPEC.md §14) ------------------------------------------------------------------
    def push(
        self, paths, *, what: str, where: str, work_id: str | None = None, start=None, end=None, progress=None, spark=None, use_spark="auto"
    ):
        """Push files or directories; times as ms since the epoch or text as typed (SPEC.md §14: ISO 8601, ``now``, ``-1d``, epoch s/ms).

        ``spark``: a SparkSession; a push of ``files.push.SPARK_FILES`` files or more then stores
        them on its executors (``use_spark="always"``: any push; ``"never"``: none)."""
        from singerlake.files.push import push

        paths = [paths] if isinstance(paths, (str, bytes)) or hasattr(paths, "__fspath__") else list(paths)
        return push(
            self.storage, paths, what=what, where=where, work_id=work_id,
            start=_when(start, "start"), end=_when(end, "end"), progress=progress, spark=spark, use_spark=use_spark,
        )  # fmt: skip

    def find_files(self, what, *, where: str = "", start=None, end=None, work_id: str | None = None) -> list[dict]:
        """The records of the files of ``what`` (a name or several) overlapping ``start``..``end``, or with ``work_id``."""
        from singerlake.files import index
        from singerlake.files.record import check_labels, whats_of

        whats = whats_of(what)
        for name in whats:
            check_labels(name, where or None, work_id)
        if work_id is not None:
            pushed = [r for name in whats for r in index.by_work_id(self.storage, name, work_id, where)]
            return pushed + self.singer_files(whats, where, work_id=work_id)
        if start is None:
            raise ConfigError("a files query needs a time range (start, end) or a work_id")
        first, last = _when(start, "start"), _when("now" if end is None else end, "end")
        if last < first:
            raise BadArgument("end", f"{iso_ms(last)} is before the start, {iso_ms(first)}")
        pushed = [r for name in whats for r in index.by_time(self.storage, name, first, last, where)]
        return pushed + self.singer_files(whats, where, first, last)

    def singer_files(self, whats: list[str], where: str = "", start: int = 0, end: int | None = None, work_id=None) -> list[dict]:
        """Landed Singer data files as files records (SPEC.md §14): what = the stream, where = the tap,
        both normalised; a time query reads only the manifest parts whose summaries overlap it."""
        from singerlake.files.record import singer_record

        found = []
        for tap_id in self._landed_taps():
            if not normalise_label(tap_id).startswith(where):
                continue
            for stream in self.streams(tap_id):
                if normalise_label(stream) not in whats:
                    continue
                manifest = self.manifest(tap_id, stream)
                if work_id is None:
                    entries = manifest.files_overlapping(start, MAX_MS if end is None else end)
                else:
                    entries = [e for e in manifest.files if e["work_id"] == work_id]
                found += [singer_record(entry, tap_id, stream) for entry in entries]
        return sorted(found, key=lambda r: (r["start"], r["where"], r["id"]))

    def _landed_taps(self) -> list[str]:
        return self.taps() if RAW in self.storage.list_dirs("") else []

    def file_whats(self) -> list[str]:
        """Every what a files query knows: of pushed files, and each landed stream's (normalised)."""
        from singerlake.files import index

        streams = {normalise_label(stream) for tap_id in self._landed_taps() for stream in self.streams(tap_id)}
        return sorted({*index.whats(self.storage), *streams})

    def file_wheres(self, what: str) -> list[str]:
        """Every where of ``what``'s files: of pushed files, and the taps (normalised) of the streams it names."""
        from singerlake.files import index

        taps = {normalise_label(t) for t in self._landed_taps() if what in map(normalise_label, self.streams(t))}
        return sorted({*index.wheres(self.storage, what), *taps})

    def latest_file(self, what: str, where: str = "") -> dict | None:
        """The file of ``what`` (pushed, or a stream's data file) whose data is newest."""
        from singerlake.files import index
        from singerlake.files.record import check_labels, newness

        check_labels(what, where or None)
        candidates = [index.latest(self.storage, what, where), *self.singer_files([what], where)]
        return max((c for c in candidates if c is not None), key=newness, default=None)

    def file_record(self, file_id: str) -> dict:
        from singerlake.files.fetch import record_of

        return record_of(self.storage, file_id)

    def fetch(self, files, out: str | BinaryIO | None = None, template: str | None = None, overwrite: bool = False) -> list:
        """Write files (ids, or records as ``find_files`` gives them) to ``out`` (a path, a directory, a
        binary stream, or ``-`` for stdout), hashes checked; a file already there is replaced only with ``overwrite`` (the
        same bytes there are left as they are). Returns what became of each (``files.fetch.Fetched``);
        raises ``FetchFailed`` (with them all) when some could not be fetched, after fetching the others."""
        from singerlake.files.errors import FetchFailed
        from singerlake.files.fetch import DEFAULT_NAME, fetch

        files = [files] if isinstance(files, (str, dict)) else list(files)
        records = [f if isinstance(f, dict) else self.file_record(f) for f in files]
        outcomes = fetch(self.storage, records, out, template or DEFAULT_NAME, overwrite)
        if any(outcome.failed for outcome in outcomes):
            raise FetchFailed(outcomes)
        return outcomes


MAX_MS = (1 << 63) - 1


def _when(value, name: str) -> int | None:
    """``start`` or ``end`` as ms since the epoch: an int as it is, text as typed (SPEC.md §14)."""
    from singerlake.times import parse_when

    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    return parse_when(str(value), name, end=name == "end")
