"""tap-singerlake: a thin singer-sdk shell over ``singerlake.replay``.

The SDK provides the CLI, settings, discovery output, catalog selection, stream maps and state
handling. Replay has two paths per stream:

- stored lines (the default): each file's SCHEMA line and RECORD lines are written to stdout
  exactly as stored, in blocks, so values are never re-typed and nothing is parsed per record;
- the SDK's per-record path, when the stream is transformed: stream maps, flattening, or
  properties deselected in the catalog. Records are parsed and mapped by the SDK there.

STATE is emitted after each file on both paths (SPEC.md §11).
"""

from __future__ import annotations

import io
import json
import sys
import typing as t

from singer_sdk import Stream, Tap
from singer_sdk import typing as th
from singer_sdk.exceptions import ConfigValidationError
from singer_sdk.helpers.capabilities import PluginCapabilities, TapCapabilities
from singer_sdk.mapper import SameRecordTransform
from singer_sdk.singerlib.json import deserialize_json
from singerlake import Lake, LakeNotFound, UnknownTap
from singerlake.errors import ConfigError
from singerlake.format.catalogue import replay_schema
from singerlake.format.manifest import Manifest
from singerlake.format.positions import Position, check_bookmark
from singerlake.replay.stream import Activate, Lines, Reached, Schema, StreamReplay, Window
from singerlake.settings import LAKE_LOCATION, invalid_settings, lake_root, storage_options
from singerlake.times import parse_time_ms

ON_CORRUPT = ("fail", "skip")
STATE_KEYS = {"bookmarks", "currently_syncing"}


class LakeStream(Stream):
    """One lake stream. Its schema fits every stored version (the latest plus older-only properties)."""

    _tap: TapSingerlake

    def __init__(self, tap: TapSingerlake, manifest: Manifest):
        self.manifest = manifest
        super().__init__(tap, schema=replay_schema(manifest), name=manifest.stream)
        self.primary_keys = manifest.versions[manifest.latest_hash()]["key_properties"]

    # -- the bookmark: the position reached in the stream's commit log ----------------------------
    @property
    def position(self) -> Position | None:
        return Position.from_bookmark(self.stream_state.get("position"), self.name)

    def reach(self, position: Position) -> None:
        self.stream_state["position"] = position.to_bookmark()

    def replay(self) -> StreamReplay:
        return StreamReplay(self._tap.lake.storage, self.manifest, self.position, self._tap.window, self._tap.skip_corrupt)

    def emits_stored_lines(self) -> bool:
        """True when nothing transforms the stream, so stored lines are the exact output."""
        maps = self.stream_maps
        untransformed = len(maps) == 1 and type(maps[0]) is SameRecordTransform and maps[0].stream_alias == self.name
        return untransformed and not self.config.get("flattening_enabled") and all(self.mask.values())

    # -- the SDK's per-record path (stream maps, flattening, deselected properties, --test) ----------
    def get_records(self, context: dict | None) -> t.Iterable[dict]:
        replay = self.replay()
        for event in replay.events():
            if isinstance(event, Lines):
                for line in event.data.splitlines():
                    yield deserialize_json(line)["record"]
            elif isinstance(event, Reached):
                # Resumed after the SDK wrote the last record yielded: everything before is out.
                self.reach(event.position)
                self.state_manager.is_flushed = False
                self._write_state_message()
            elif isinstance(event, Activate):
                self._write_activate_version_message(event.version)
        self._tap.log_replay(self.name, replay)


def _stdout_writer() -> t.Callable[[bytes], t.Any]:
    """Bytes to stdout through the same buffer the SDK's text writer flushes into, so order is kept."""
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is not None:
        return buffer.write
    return lambda data: sys.stdout.write(data.decode("utf-8"))


class TapSingerlake(Tap):
    """Replays a Singerlake (local or S3) exactly, in commit order, incrementally, optionally within a time window."""

    name = "tap-singerlake"
    # No BATCH: a BATCH message would be written after the STATE of the files it holds.
    capabilities: t.ClassVar[list] = [
        TapCapabilities.CATALOG,
        TapCapabilities.STATE,
        TapCapabilities.DISCOVER,
        TapCapabilities.ACTIVATE_VERSION,
        PluginCapabilities.ABOUT,
        PluginCapabilities.STREAM_MAPS,
        PluginCapabilities.FLATTENING,
        PluginCapabilities.STRUCTURED_LOGGING,
    ]
    # Ours alone: the SDK adds its standard settings to config_jsonschema in some processes, not others.
    declared_settings = th.PropertiesList(
        *(th.Property(s.name, th.StringType, description=s.description, secret=s.secret) for s in LAKE_LOCATION),
        th.Property("tap_id", th.StringType, description="Which tap's data to replay (a tap id under raw/ in the lake)."),
        th.Property(
            "streams",
            th.ArrayType(th.StringType),
            description="Replay only these streams (default: all). Catalog selection also applies.",
        ),
        th.Property(
            "start_date",
            th.DateTimeType,
            description="Replay only records whose time is at or after this (ISO 8601; naive means UTC).",
        ),
        th.Property("end_date", th.DateTimeType, description="Replay only records whose time is before this (ISO 8601)."),
        th.Property(
            "on_corrupt_file",
            th.StringType,
            allowed_values=list(ON_CORRUPT),
            default="fail",
            description="'fail': stop at a damaged or missing data file, naming it. 'skip': warn and go on without its records.",
        ),
    )
    config_jsonschema = declared_settings.to_dict()

    # -- state -------------------------------------------------------------------------------------
    @classmethod
    def invoke(cls, *, state: t.IO[str] | None = None, **options) -> None:  # ty:ignore[invalid-method-override]
        """The SDK's run, with a state file that is not a JSON object refused naming the file."""
        if state is not None:
            text, name = state.read(), getattr(state, "name", "--state")
            try:
                loaded = json.loads(text)
            except ValueError as exc:
                raise ConfigError(f"state file {name}: not JSON ({exc})") from None
            if not isinstance(loaded, dict):
                raise ConfigError(f"state file {name}: a state must be a JSON object, got a {type(loaded).__name__}")
            state = io.StringIO(text)
        super().invoke(state=state, **options)

    def load_state(self, state: dict[str, t.Any]) -> None:
        """Meltano's wrapped ``{"singer_state": ...}`` is unwrapped; a state that is not tap-singerlake's
        (another tap's bookmarks, no ``position``) is refused rather than read as "replay everything"."""
        if set(state) == {"singer_state"} and isinstance(state["singer_state"], dict):
            state = state["singer_state"]
        unknown = sorted(set(state) - STATE_KEYS)
        if unknown:
            raise ConfigError(f"state: {unknown} are not Singer state keys; expected {{'bookmarks': {{<stream>: {{'position': ...}}}}}}")
        bookmarks = state.get("bookmarks", {})
        if not isinstance(bookmarks, dict) or not all(isinstance(value, dict) for value in bookmarks.values()):
            raise ConfigError("state: 'bookmarks' must be an object of one object per stream")
        for stream, bookmark in bookmarks.items():
            if bookmark and "position" not in bookmark:
                raise ConfigError(
                    f"state: stream {stream!r} has bookmark keys {sorted(bookmark)} but no 'position': it is not a "
                    "tap-singerlake state (another tap's?); remove the stream's bookmark to replay it from the start"
                )
        super().load_state(state)

    # -- settings ----------------------------------------------------------------------------------
    def _validate_config(self, *, raise_errors: bool = True) -> list[str]:
        try:
            return super()._validate_config(raise_errors=raise_errors)
        except ConfigValidationError as exc:
            raise invalid_settings(exc) from None

    @property
    def lake(self) -> Lake:
        if not hasattr(self, "_lake"):
            try:
                lake = Lake.open(lake_root(self.config), **storage_options(self.config))
                lake.check_exists()
            except (LakeNotFound, ValueError) as exc:
                raise ConfigError(f"setting 'lake_root': {exc}") from exc
            self._lake = lake
        return self._lake

    @property
    def tap_id(self) -> str:
        tap_id = self.config.get("tap_id")
        try:
            if not tap_id:
                raise UnknownTap(f"setting 'tap_id' is missing: say which tap's data to replay; taps present: {self.lake.taps() or 'none'}")
            self.lake.check_tap(tap_id)
        except UnknownTap as exc:
            raise ConfigError(f"setting 'tap_id': {exc}") from exc
        return tap_id

    @property
    def window(self) -> Window:
        bounds = {}
        for name in ("start_date", "end_date"):
            value = self.config.get(name)
            bounds[name] = None if value is None else parse_time_ms(value)
            if value is not None and bounds[name] is None:
                raise ConfigError(f"setting {name!r}: {value!r} is not an ISO 8601 date-time")
        return Window(bounds["start_date"], bounds["end_date"])

    @property
    def skip_corrupt(self) -> bool:
        choice = self.config.get("on_corrupt_file") or "fail"
        if choice not in ON_CORRUPT:
            raise ConfigError(f"setting 'on_corrupt_file' must be one of {ON_CORRUPT}, got {choice!r}")
        return choice == "skip"

    # -- discovery ---------------------------------------------------------------------------------
    def discover_streams(self) -> list[Stream]:
        _ = self.window, self.skip_corrupt  # setting errors first, before the lake is read
        tap_id = self.tap_id
        present = self.lake.streams(tap_id)
        wanted = self.config.get("streams") or present
        missing = sorted(set(wanted) - set(present))
        if missing:
            raise ConfigError(f"setting 'streams': {missing} not in tap {tap_id!r}; streams present: {present}")
        manifests = (self.lake.manifest(tap_id, stream) for stream in wanted)
        return [LakeStream(self, manifest) for manifest in manifests if manifest.versions]

    # -- replay ------------------------------------------------------------------------------------
    def sync_all(self) -> None:
        bookmarks = self.state.get("bookmarks", {})  # read, not through stream_state (which would add empty entries)
        for stream in self.streams.values():  # every bookmark is checked before anything is emitted
            if stream.selected:
                check_bookmark(Position.from_bookmark(bookmarks.get(stream.name, {}).get("position"), stream.name), stream.manifest)
        if self.state:
            self.state_writer.write_state(self.state)
        for stream in self.streams.values():
            if not stream.selected:
                self.logger.info("Skipping deselected stream %r", stream.name)
            elif stream.emits_stored_lines():
                self._replay_stored_lines(stream)
            else:
                self.logger.info("Stream %r is transformed (maps, flattening or deselected properties): per-record path", stream.name)
                stream.sync()

    def _replay_stored_lines(self, stream: LakeStream) -> None:
        write = _stdout_writer()
        replay = stream.replay()
        for event in replay.events():
            if isinstance(event, Lines):
                write(event.data)
            elif isinstance(event, Schema):
                write(event.line)
            elif isinstance(event, Reached):
                stream.reach(event.position)
                self.state_writer.write_state(self.state)
            elif isinstance(event, Activate):
                write(b'{"type":"ACTIVATE_VERSION","stream":%s,"version":%d}\n' % (_json_text(stream.name), event.version))
        self.log_replay(stream.name, replay)

    def log_replay(self, stream: str, replay: StreamReplay) -> None:
        self.logger.info(
            "Replayed stream %r: %d files read, %d skipped as corrupt, %d files in the lake (%d manifest parts read)",
            stream,
            len(replay.files_opened),
            len(replay.files_skipped),
            replay.manifest.file_count(),
            replay.parts_opened,
        )


def _json_text(text: str) -> bytes:
    return json.dumps(text, ensure_ascii=False).encode("utf-8")


if __name__ == "__main__":
    TapSingerlake.cli()
