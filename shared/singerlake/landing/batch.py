"""A batch of landing (SPEC.md §10): segments of records and ACTIVATE_VERSION marks, per stream, in arrival order.

A *segment* is consecutive records of one stream under one schema, already cut into gzipped
chunks while input is read, so the drain only hands finished chunks to Spark. A batch ends when
it reaches its row or byte limit, or its age (``Batch.full`` / ``Batch.age_s``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from singerlake.landing.spark_write import Chunk, ChunkCompressor


class Segment:
    """Consecutive records of one stream under one schema (``schema`` is the reader's StreamSchema)."""

    def __init__(self, stream: str, schema: Any, chunk_bytes: int, compressor: ChunkCompressor):
        self.stream = stream
        self.schema = schema
        self.chunk_bytes = chunk_bytes
        self.compressor = compressor
        self.chunks: list[Chunk] = []
        self.buffer = bytearray()
        self.start, self.end = math.inf, -math.inf

    def add(self, line: bytes, stamp: int) -> None:
        if stamp < self.start:
            self.start = stamp
        if stamp > self.end:
            self.end = stamp
        self.buffer += line
        if len(self.buffer) >= self.chunk_bytes:
            self.seal()

    def seal(self) -> None:
        if self.buffer:
            self.chunks.append(self.compressor.chunk(self.buffer, self.buffer.count(b"\n"), self.start, self.end))
            self.buffer = bytearray()
            self.start, self.end = math.inf, -math.inf

    @property
    def records(self) -> int:
        return sum(chunk.records for chunk in self.chunks)


@dataclass
class ActivateVersion:
    version: Any
    received_ms: int


class Batch:
    """What arrived since the last cut: per stream, its segments and ACTIVATE_VERSION marks in order."""

    def __init__(self, chunk_bytes: int, compressor: ChunkCompressor):
        self.chunk_bytes = chunk_bytes
        self.compressor = compressor
        self.streams: dict[str, list[Segment | ActivateVersion]] = {}
        self._open: dict[str, Segment] = {}  # the segment a stream's next record joins
        self.rows = 0
        self.bytes = 0
        self.started = time.monotonic()

    def add(self, stream: str, schema: Any, line: bytes, stamp: int) -> None:
        segment = self._open.get(stream)
        if segment is None or segment.schema is not schema:  # a new SCHEMA starts a new segment
            segment = self._open[stream] = Segment(stream, schema, self.chunk_bytes, self.compressor)
            self.streams.setdefault(stream, []).append(segment)
        segment.add(line, stamp)
        self.rows += 1
        self.bytes += len(line)

    def activate_version(self, stream: str, mark: ActivateVersion) -> None:
        """Its place is exact: records after it start a new segment."""
        self.streams.setdefault(stream, []).append(mark)
        self._open.pop(stream, None)

    def full(self, max_rows: int, max_bytes: int) -> bool:
        return self.rows >= max_rows or self.bytes >= max_bytes

    def age_s(self) -> float:
        return time.monotonic() - self.started

    def seal(self) -> None:
        """Compress every open buffer; called by the batch's owner, the only thread feeding the compressor."""
        for segment in self.segments():
            segment.seal()
        self._open.clear()

    def segments(self) -> list[Segment]:
        return [item for items in self.streams.values() for item in items if isinstance(item, Segment)]

    def __bool__(self) -> bool:
        return bool(self.streams)
