"""Landing a Singer message stream in the lake: read, batch, drain (SPEC.md §10).

The ``Lander`` is the reading side: it routes each message, decoding only envelopes and keeping
RECORD lines as the exact bytes received, and fills a ``Batch`` (``batch.py``). A batch is cut at
its row, byte or age limit, or at a STATE when nothing is buffered, and handed with the STATE
received before the cut to the ``Drain`` (``drain.py``), which writes, commits and only then
emits that STATE. While a batch drains, the next one fills, so reading overlaps Spark; at most
``queued_batches`` wait behind the draining one, which bounds memory.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from singerlake.commits.lock import DEFAULT_DRIFT_S, DEFAULT_LEASE_S, DEFAULT_WAIT_S
from singerlake.format.datafile import DEFAULT_COMPRESSLEVEL
from singerlake.format.errors import BadInput, MissingKeyProperties, RecordBeforeSchema
from singerlake.format.messages import RecordDecoder, TimeParser, decode_envelope, decode_full
from singerlake.format.schema_hash import schema_hash
from singerlake.lake import Lake
from singerlake.landing.batch import ActivateVersion, Batch
from singerlake.landing.drain import Drain, DrainJob
from singerlake.landing.errors import LandingError, Terminated
from singerlake.landing.spark_write import CHUNK_BYTES, ChunkCompressor
from singerlake.times import now_ms, record_time_ms

__all__ = ["Lander", "LandingError", "LandingSettings", "Terminated"]

log = logging.getLogger("singerlake.landing")


@dataclass
class LandingSettings:
    tap_id: str
    batch_max_rows: int = 100_000
    batch_max_bytes: int = 32 << 20
    max_file_bytes: int = 256 << 20
    max_batch_age_s: float = 300.0
    lock_wait_s: float = DEFAULT_WAIT_S
    lock_lease_s: float = DEFAULT_LEASE_S
    lock_drift_s: float = DEFAULT_DRIFT_S
    compresslevel: int = DEFAULT_COMPRESSLEVEL
    validate_records: bool = False
    work_id: str | None = None
    annotations: dict[str, Any] | None = None
    queued_batches: int = 1  # batches waiting behind the one draining (memory: queued + 2 batches)
    confirm_files: bool = False  # executors may not share the driver's view of storage: check files before committing
    progress_interval_s: float = 60.0  # while reading, log the running total this often (batches log at each commit)


@dataclass
class StreamSchema:
    """The current SCHEMA of a stream, as received."""

    message: dict[str, Any]
    line: bytes
    hash: str
    key_properties: list[str]
    decoder: RecordDecoder
    validator: Any = None
    writer_opening: bool = False  # its writer was handed to the drain to open (on its first record)


class _State(msgspec.Struct):
    value: msgspec.Raw = msgspec.Raw(b"")


_state_decoder = msgspec.json.Decoder(_State)

_VALID_SCHEMAS: dict[str, bool] = {}  # draft 7 verdicts on (sub-)schemas already checked, by canonical JSON


def _is_valid_schema(schema: Any) -> bool:
    """Whether ``schema`` is a valid draft 7 JSON Schema, checked property by property with every
    verdict remembered: a tap's tables share most of their column schemas, and checking a whole
    schema against the meta-schema costs ~1 ms (1 s of CPU in a 1,000-stream run). Exact: the
    meta-schema checks each of ``properties``' values against itself, independently of the rest."""
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if isinstance(properties, dict) and properties:
        return _is_valid_schema({**schema, "properties": {}}) and all(_is_valid_schema(sub) for sub in properties.values())
    key = json.dumps(schema, sort_keys=True)
    verdict = _VALID_SCHEMAS.get(key)
    if verdict is None:
        from jsonschema import Draft7Validator

        if len(_VALID_SCHEMAS) > 100_000:
            _VALID_SCHEMAS.clear()
        verdict = _VALID_SCHEMAS[key] = Draft7Validator(Draft7Validator.META_SCHEMA).is_valid(schema)
    return verdict


class Lander:
    def __init__(
        self,
        lake: Lake,
        settings: LandingSettings,
        spark: Callable[[], Any],
        emit_state: Callable[[bytes], None],
    ):
        self.lake = lake
        self.settings = settings
        self.max_rows, self.max_bytes = settings.batch_max_rows, settings.batch_max_bytes
        self.schemas: dict[str, StreamSchema] = {}
        self._hot: StreamSchema | None = None  # the stream of the last RECORD
        self.parse_time = TimeParser()
        self.compressor = ChunkCompressor(settings.compresslevel)
        self.line_number = 0
        self.counts = {"RECORD": 0, "SCHEMA": 0, "STATE": 0, "ACTIVATE_VERSION": 0, "BATCH": 0}
        self.batch = Batch(CHUNK_BYTES, self.compressor)
        self.latest_state: bytes | None = None
        self.scheduled_state: bytes | None = None
        self.stop_requested = False
        self.waiting_for_input = False
        self.drain = Drain(lake, settings, spark, emit_state, settings.queued_batches)
        self._spark = spark
        # The batch belongs to whoever holds this: the reading loop per message, or the age watch.
        self._mutex = threading.Lock()
        self._stopped = threading.Event()
        self._started = self._last_progress = time.monotonic()
        self._watch = threading.Thread(target=self._watch_age, name="singerlake-batch-age", daemon=True)
        self._watch.start()

    # -- reading ---------------------------------------------------------------------------------
    def _read(self, lines: Iterable[bytes | str]) -> Iterator[bytes | str]:
        """The input, marking the only place where SIGTERM may interrupt: waiting for the next line."""
        source = iter(lines)
        while True:
            if self.stop_requested:
                raise Terminated()
            self.waiting_for_input = True
            try:
                line = next(source, None)
            finally:
                self.waiting_for_input = False
            if line is None:
                return
            yield line

    def feed(self, lines: Iterable[bytes | str]) -> None:
        """Process input lines; raises BadInput naming the line, Terminated on SIGTERM."""
        for line in self._read(lines):
            with self._mutex:
                self._message(line)

    def _message(self, line: bytes | str) -> None:
        """One input message; the caller holds the batch mutex."""
        self.line_number += 1
        if isinstance(line, str):
            line = line.encode("utf-8")
        if (len(line) < 8 or line[:1].isspace()) and not line.strip():  # blank (or whitespace-only) line
            return
        hot = self._hot
        if hot is not None:  # the common case: another RECORD of the stream just seen, one decode
            envelope = hot.decoder.decode(line)
            if envelope is not None:
                self._record(hot, envelope, line)
                self.counts["RECORD"] += 1
                return
        envelope = decode_envelope(line, self.line_number)
        kind = envelope.type
        if kind == "RECORD":
            self._other_record(envelope, line)
        elif kind == "STATE":
            self._state(line)
        elif kind == "SCHEMA":
            self._schema(line)
        elif kind == "ACTIVATE_VERSION":
            self._activate_version(line)
        elif kind == "BATCH":
            self._batch_message(line)
        else:
            raise BadInput(f"line {self.line_number}: unknown message type {kind!r}")
        self.counts[kind] += 1

    def _other_record(self, envelope, line: bytes) -> None:
        """A RECORD the hot decoder did not take: of another stream, or bad (named here)."""
        number, stream = self.line_number, envelope.stream
        current = self.schemas.get(stream)
        if current is None:
            raise RecordBeforeSchema(f"line {number}: RECORD for stream {stream!r} arrived before its SCHEMA")
        decoded = current.decoder.decode(line)
        if decoded is None:  # the generic envelope is fine, so 'record' is missing or not an object
            raise BadInput(f"line {number}: RECORD for stream {stream!r} needs a JSON object in 'record'")
        self._hot = current
        self._record(current, decoded, line)

    def _record(self, current: StreamSchema, envelope, line: bytes) -> None:
        number, stream = self.line_number, envelope.stream
        if not line.isascii():  # msgspec does not check the UTF-8 of values it skips; readers would fail on it
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise BadInput(f"line {number}: RECORD for stream {stream!r} is not valid UTF-8 (byte {exc.start})") from None
        missing = current.decoder.missing_keys(envelope.record)
        if missing:
            raise MissingKeyProperties(f"line {number}: RECORD for stream {stream!r} lacks key properties {missing}")
        if current.validator is not None:
            self._validate(current, line, number, stream)
        stamp = record_time_ms(envelope.time_extracted, lambda: current.decoder.sdc_extracted_at(envelope.record), parse=self.parse_time)
        if stamp is None:  # not `or`: a record extracted at the epoch (0 ms) keeps its time
            stamp = now_ms()
        if not line.endswith(b"\n"):
            line += b"\n"
        if not current.writer_opening:
            self.drain.open_writer(current)  # lock and registration start now, in the background
            current.writer_opening = True
        batch = self.batch
        batch.add(stream, current, line, stamp)
        if batch.full(self.max_rows, self.max_bytes):
            self._drain()
        elif batch.rows % 10_000 == 0:
            getattr(self._spark, "begin", lambda: None)()  # not a tiny run: a deferred Spark starts now
            self._drain_if_old()

    def _validate(self, current: StreamSchema, line: bytes, number: int, stream: str) -> None:
        error = next(iter(current.validator.iter_errors(json.loads(line)["record"])), None)
        if error is not None:
            where = "/".join(str(part) for part in error.absolute_path) or "(record)"
            raise BadInput(f"line {number}: RECORD for stream {stream!r} fails its schema at {where}: {error.message}")

    def _schema(self, line: bytes) -> None:
        number = self.line_number
        message = decode_full(line, number)
        stream, schema = message.get("stream"), message.get("schema")
        if not isinstance(stream, str) or not stream:
            raise BadInput(f"line {number}: SCHEMA message needs a non-empty 'stream'")
        if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
            raise BadInput(f"line {number}: SCHEMA for stream {stream!r} needs a 'schema' object with 'properties'")
        keys = message.get("key_properties") or []
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise BadInput(f"line {number}: SCHEMA for stream {stream!r}: 'key_properties' must be a list of names")
        digest = schema_hash(schema, keys)
        current = self.schemas.get(stream)
        if current is not None and current.hash == digest:
            return  # an identical SCHEMA changes nothing
        validator = self._validator(schema, stream, number)
        self.schemas[stream] = StreamSchema(message, line.rstrip(b"\r\n"), digest, keys, RecordDecoder(stream, keys), validator)
        self._hot = None  # the stream's records now take its new decoder

    def _validator(self, schema: dict, stream: str, number: int):
        """The record validator when validating; a schema that is not valid JSON Schema is refused
        then (no record could be checked against it), and only warned about otherwise (stored as sent)."""
        from jsonschema import Draft7Validator
        from jsonschema.exceptions import best_match

        error = None if _is_valid_schema(schema) else best_match(Draft7Validator(Draft7Validator.META_SCHEMA).iter_errors(schema))
        if error is not None:
            where = "/".join(str(part) for part in error.absolute_path) or "(schema)"
            problem = f"line {number}: SCHEMA for stream {stream!r} is not a valid JSON Schema at {where}: {error.message}"
            if self.settings.validate_records:
                raise BadInput(problem)
            log.warning("%s (stored as sent; validate_records would refuse it)", problem)
        return Draft7Validator(schema) if self.settings.validate_records else None

    def _state(self, line: bytes) -> None:
        value = _state_decoder.decode(line).value
        if not value:
            raise BadInput(f"line {self.line_number}: STATE message needs a 'value'")
        self.latest_state = bytes(value)
        if not self.batch:
            self._drain()  # nothing buffered: it only waits for batches already draining
        else:
            self._drain_if_old()

    def _activate_version(self, line: bytes) -> None:
        message = decode_full(line, self.line_number)
        stream = message.get("stream")
        if stream not in self.schemas:
            raise RecordBeforeSchema(f"line {self.line_number}: ACTIVATE_VERSION for stream {stream!r} arrived before its SCHEMA")
        self.batch.activate_version(stream, ActivateVersion(message.get("version"), now_ms()))

    def _batch_message(self, line: bytes) -> None:
        from singerlake.landing.batch_files import read_batch_records

        number = self.line_number
        message = decode_full(line, number)
        stream = message.get("stream")
        if stream not in self.schemas:
            raise RecordBeforeSchema(f"line {number}: BATCH for stream {stream!r} arrived before its SCHEMA")
        prefix = b'{"type":"RECORD","stream":' + json.dumps(stream, ensure_ascii=False).encode() + b',"record":'
        for source, record in read_batch_records(message, self.lake.storage, number):
            wrapped = prefix + record + b"}\n"
            try:
                self._other_record(decode_envelope(wrapped, number), wrapped)
            except BadInput as exc:
                raise BadInput(f"{exc} (in BATCH file {source})") from None

    # -- draining --------------------------------------------------------------------------------
    def _watch_age(self) -> None:
        """Commit an old batch even while no input arrives (a slow or paused tap), so its STATE goes out."""
        interval = max(0.05, min(1.0, self.settings.max_batch_age_s / 4, self.settings.progress_interval_s))
        while not self._stopped.wait(interval):
            if self._mutex.acquire(blocking=False):  # else the reader is busy and checks ages itself
                try:
                    self._drain_if_old()
                except LandingError:
                    pass  # the drain's error: the reading thread raises it on its next cut or at the end
                finally:
                    self._mutex.release()
            self._log_progress()

    def _log_progress(self) -> None:
        """A long batch commits rarely: between commits, say how far the reading is."""
        now = time.monotonic()
        if now - self._last_progress < self.settings.progress_interval_s:
            return
        self._last_progress = now
        records = self.counts["RECORD"]
        log.info(
            "reading: %s records received so far (%s/s), %s of them in the batch being filled",
            f"{records:,}",
            f"{records / (now - self._started):,.0f}",
            f"{self.batch.rows:,}",
        )

    def _drain_if_old(self) -> None:
        if self.batch.rows and self.batch.age_s() >= self.settings.max_batch_age_s:
            self._drain()

    def _drain(self, final: bool = False) -> None:
        """Cut the batch and hand it, with the STATE not yet scheduled, to the drain (waiting while it is behind).

        ``final``: nothing follows (the input ended): each stream's locks go as soon as its commits are done.
        """
        state = self.latest_state if self.latest_state != self.scheduled_state else None
        if not self.batch and state is None:
            return
        self.batch.seal()
        self.drain.submit(DrainJob(self.batch, state, final))
        if state is not None:
            self.scheduled_state = state
        self.batch = Batch(CHUNK_BYTES, self.compressor)

    # -- ending ----------------------------------------------------------------------------------
    def finish(self) -> None:
        """Drain and commit everything, emit the last STATE received, release the locks."""
        self._stop_watch()
        try:
            self._drain(final=True)
            self.drain.stop()
            self.drain.raise_if_failed()
        finally:
            self.close()

    def abort(self) -> None:
        """After bad input: batches already handed over still commit; the current one is dropped."""
        self._stop_watch()
        try:
            self.drain.stop()
            if self.drain.error is not None:
                log.error("a batch before the failure could not be committed either: %s", self.drain.error)
        finally:
            self.close()

    def _stop_watch(self) -> None:
        self._stopped.set()
        self._watch.join()

    def close(self) -> None:
        """Release every lock (also after a failure: uncommitted files stay invisible)."""
        self.compressor.close()
        self.drain.close()

    def request_stop(self) -> None:
        """From a signal handler: stop reading. Raises only while blocked on input, so no message
        is ever half processed; otherwise the reading loop stops before its next line."""
        self.stop_requested = True
        if self.waiting_for_input:
            raise Terminated()
