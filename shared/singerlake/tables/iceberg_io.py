"""pyiceberg's FileIO for a local lake, with the lake's durability (SPEC.md §9): each metadata file,
manifest list and manifest is fsynced with its directories when written, so the catalog's commit,
which comes after, never names a file a power cut could take away. pyiceberg's own local FileIO
(pyarrow's) does not fsync."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyiceberg.io.pyarrow import PyArrowFileIO

from singerlake.storage import LocalStorage

ROOT = "singerlake.local-root"  # the catalog property naming the lake root (a local directory)
IMPL = f"{__name__}.DurableFileIO"


def properties(storage: LocalStorage) -> dict[str, str]:
    """The catalog properties that make pyiceberg write this lake's files through ``DurableFileIO``."""
    return {"py-io-impl": IMPL, ROOT: str(storage.root)}


class DurableFileIO(PyArrowFileIO):
    def new_output(self, location: str):
        return _DurableOutput(super().new_output(location), LocalStorage(self.properties[ROOT]))


class _DurableOutput:
    """pyiceberg's output file, its stream made durable when closed."""

    def __init__(self, output, storage: LocalStorage) -> None:
        self._output, self._storage = output, storage

    def create(self, overwrite: bool = False) -> _DurableStream:
        return _DurableStream(self._output.create(overwrite), self._storage, Path(self._output._path))

    def __len__(self) -> int:
        return len(self._output)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._output, name)


class _DurableStream:
    def __init__(self, stream, storage: LocalStorage, path: Path) -> None:
        self._stream, self._storage, self._path = stream, storage, path

    def close(self) -> None:
        if not self._stream.closed:
            self._stream.close()
            self._storage.sync([self._path.relative_to(self._storage.root).as_posix()])

    def __enter__(self) -> _DurableStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
