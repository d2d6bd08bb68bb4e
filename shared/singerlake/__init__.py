"""Singerlake core: the lake format, storage, locks and commits shared by tap and target."""

from singerlake.errors import ConfigError, SingerlakeError
from singerlake.lake import Lake, LakeNotFound, UnknownTap
from singerlake.manifest import SPEC_VERSION, Manifest
from singerlake.schema_hash import schema_hash
from singerlake.storage import open_storage
from singerlake.writer import SchemaWriter

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "Lake",
    "LakeNotFound",
    "Manifest",
    "SPEC_VERSION",
    "SchemaWriter",
    "SingerlakeError",
    "UnknownTap",
    "open_storage",
    "schema_hash",
]
