"""target-singerlake: a thin singer-sdk shell over ``singerlake.landing``.

The SDK provides the CLI, settings, ``--about`` and logging. Messages do not go through the SDK's
per-record sink path: a raw zone stores each RECORD line exactly as received, so the reader hands
raw lines to the core's Lander, which batches them into Spark DataFrames (see SPEC.md).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import typing as t
import uuid
from collections import Counter

from singer_sdk import Target
from singer_sdk import typing as th
from singer_sdk.exceptions import ConfigValidationError, MissingKeyPropertiesError, RecordsWithoutSchemaException
from singer_sdk.helpers.capabilities import PluginCapabilities, TargetCapabilities
from singer_sdk.singerlib.encoding.base import GenericSingerReader
from singer_sdk.sinks import RecordSink
from singerlake import Lake
from singerlake.errors import INTERRUPTED_EXIT, ConfigError, Interrupted
from singerlake.format.catalogue import ANNOTATIONS
from singerlake.format.errors import MissingKeyProperties, RecordBeforeSchema
from singerlake.format.metadata import label_problem
from singerlake.format.names import normalise_label
from singerlake.landing.errors import RootUnusable, Terminated
from singerlake.landing.lander import Lander, LandingSettings
from singerlake.landing.spark_write import warm_up
from singerlake.settings import LAKE_LOCATION, invalid_settings, lake_root, storage_options
from singerlake.spark import warm
from singerlake.spark.errors import SparkStartError
from singerlake.spark.java import ensure_java
from singerlake.spark.masters import is_in_process_master, resolve_master, runs_on_this_machine
from singerlake.spark.placement import check_lake_reachable, conf_of_setting
from singerlake.spark.session import LOCAL_START_DEFER_S, SparkStarter, spark_session, stop_session
from singerlake.storage import StorageError, proven


class UnusedSink(RecordSink):
    """The SDK requires a sink class; records never reach it (the Lander lands them)."""

    def process_record(self, record: dict, context: dict) -> None:  # pragma: no cover - never called
        raise RuntimeError("records are landed by singerlake.landing, not by SDK sinks")


class LakeReader(GenericSingerReader[bytes]):
    """Feeds raw input lines to the target's Lander instead of decoding them for SDK sinks."""

    target: TargetSingerlake

    @property
    def default_input(self) -> t.IO[bytes]:
        return sys.stdin.buffer

    def deserialize_json(self, line: bytes) -> dict:  # pragma: no cover - the Lander decodes
        raise NotImplementedError

    def process_lines(self, file_input, callbacks) -> Counter:
        source = file_input if file_input is not None else self.default_input
        source = getattr(source, "buffer", source)  # read bytes: stored lines stay byte-exact
        lander = self.target.lander
        try:
            lander.feed(source)
        except Terminated:
            self.target.logger.info("Termination requested: committing what was received, then stopping")
        except RecordBeforeSchema as exc:
            lander.abort()
            raise RecordsWithoutSchemaException(str(exc)) from exc
        except MissingKeyProperties as exc:
            lander.abort()
            raise MissingKeyPropertiesError(str(exc)) from exc
        except BaseException as exc:
            lander.abort()
            self.target.root_failed(exc)
            raise
        return Counter(lander.counts)


def _setting(name: str, kind, description: str, **kwargs) -> th.Property:
    return th.Property(name, kind, description=description, **kwargs)


class TargetSingerlake(Target):
    """Lands any tap's streams losslessly in a Singerlake (local or S3) through Spark, committing atomically."""

    name = "target-singerlake"
    default_sink_class = UnusedSink
    message_reader_class = LakeReader
    capabilities: t.ClassVar[list] = [
        PluginCapabilities.ABOUT,
        PluginCapabilities.STRUCTURED_LOGGING,
        PluginCapabilities.BATCH,
        PluginCapabilities.ACTIVATE_VERSION,
        TargetCapabilities.VALIDATE_RECORDS,
    ]
    # Ours alone: the SDK adds its standard settings to config_jsonschema in some processes, not others.
    declared_settings = th.PropertiesList(
        *(_setting(s.name, th.StringType, s.description, secret=s.secret) for s in LAKE_LOCATION),
        _setting(
            "tap_id",
            th.StringType,
            "Tap id the streams are filed under (raw/<tap_id>/...). Defaults to $MELTANO_EXTRACTOR_NAME when run by Meltano.",
        ),
        _setting(
            "work_id",
            th.StringType,
            "Id recorded on every file of the run (^[a-z0-9_-]+$), to find them with `singerlake files --work-id`. "
            "Defaults to $MELTANO_RUN_ID (meltano run --run-id) when set, else a new id; printed at the end of the run.",
        ),
        _setting("owner", th.StringType, "Owner of this tap's data (person or team), recorded in raw/singerlake.json."),
        _setting("description", th.StringType, "What this tap's data is for, recorded in raw/singerlake.json."),
        _setting("docs_url", th.StringType, "Link to the tap's documentation, recorded in raw/singerlake.json."),
        _setting("logs_url", th.StringType, "Link to the job's status or logs, recorded in raw/singerlake.json."),
        _setting("lock_wait_seconds", th.NumberType, "How long to wait for another writer's stream-schema lock.", default=600),
        _setting("lock_lease_seconds", th.NumberType, "Lock lease: a lock not refreshed for lease + drift is stale.", default=60),
        _setting("lock_drift_seconds", th.NumberType, "Clock-drift margin added to the lease before a takeover.", default=10),
        _setting("batch_max_rows", th.IntegerType, "Records per batch (one Spark DataFrame and one commit).", default=100_000),
        _setting("batch_max_bytes", th.IntegerType, "Bytes of Singer text per batch.", default=32 << 20),
        _setting("max_file_bytes", th.IntegerType, "Bytes of Singer text per data file before it is split.", default=256 << 20),
        _setting("max_batch_age_seconds", th.NumberType, "Commit a batch once its first record is this old.", default=300),
        _setting("compression_level", th.IntegerType, "gzip level of data files (1 fastest .. 9 smallest).", default=6),
        _setting(
            "validate_records",
            th.BooleanType,
            "Validate records against their SCHEMA (off: a raw zone stores what it gets).",
            default=False,
        ),
        _setting(
            "spark_master", th.StringType, "Spark master, e.g. local[*], local-cluster[2,1,1024], spark://host:7077.", default="local[*]"
        ),
        _setting(
            "spark_remote", th.StringType, "Spark Connect URL (sc://host:port; default $SPARK_REMOTE); replaces spark_master when set."
        ),
        _setting(
            "spark_warm",
            th.BooleanType,
            "Run on this machine's warm Spark (a local Spark Connect server kept running between runs; default $SINGERLAKE_SPARK_WARM).",
        ),
        _setting(
            "lake_root_shared",
            th.BooleanType,
            "A local lake_root that every Spark executor mounts at the same path (e.g. NFS): needed to use one with a cluster.",
            default=False,
        ),
        _setting("spark_conf", th.ObjectType(), "Extra Spark configuration, passed to the session as is."),
    )
    config_jsonschema = declared_settings.to_dict()

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        logging.getLogger("py4j").setLevel(logging.WARNING)  # one INFO line per Spark call otherwise
        self.message_reader.target = self
        self.lake = self._open_lake()
        self.spark = self._start_spark()
        self.lander = Lander(self.lake, self._landing_settings(), self.spark, self._emit_state)

    # -- settings, checked before any input is read ------------------------------------------------
    def _validate_config(self, *, raise_errors: bool = True) -> list[str]:
        try:
            return super()._validate_config(raise_errors=raise_errors)
        except ConfigValidationError as exc:
            raise invalid_settings(exc) from None

    @classmethod
    def append_builtin_config(cls, config_jsonschema: dict) -> None:
        """No SDK record settings (metadata columns, load method, flattening): records are stored as sent."""

    def _tap_id(self) -> str:
        tap_id = self.config.get("tap_id") or os.environ.get("MELTANO_EXTRACTOR_NAME")
        if not tap_id:
            raise ConfigError(
                "setting 'tap_id' is missing (and $MELTANO_EXTRACTOR_NAME is not set): "
                "say which tap's data this is, e.g. tap_id=tap-postgres"
            )
        return tap_id

    def _open_lake(self) -> Lake:
        """The lake, its root probed (SPEC.md §10) unless a run on this machine wrote there before: then
        the run's first requests are the check, and a failure there names the setting all the same."""
        try:
            lake = Lake.open(lake_root(self.config), **storage_options(self.config))
            self._check_lake_reachable(lake)
            self._root_probed = not proven.is_proven(lake.storage)
            if self._root_probed:
                _probe(lake.storage)
        except StorageError as exc:
            raise ConfigError(f"setting 'lake_root': {exc}") from exc
        return lake

    def _probe_root(self) -> None:
        """For a STATE that would go out before the run made any request: the root must answer first."""
        try:
            _probe(self.lake.storage)
        except StorageError as exc:
            proven.forget(self.lake.storage)
            raise RootUnusable(f"setting 'lake_root': {exc}") from exc
        self._root_probed = True

    def root_failed(self, exc: BaseException) -> None:
        """The run's first requests failed for the root itself: probe it at the start of the next run again."""
        if isinstance(exc, RootUnusable):
            proven.forget(self.lake.storage)

    def _spark_place(self) -> tuple[str, str | None]:
        try:
            return resolve_master(self.config.get("spark_master") or "local[*]", self.config.get("spark_remote"))
        except ValueError as exc:
            raise ConfigError(f"settings 'spark_master'/'spark_remote': {exc}") from None

    def _on_this_machine(self) -> bool:
        return runs_on_this_machine(*self._spark_place())

    def _check_lake_reachable(self, lake: Lake) -> None:
        """Executors elsewhere would write a local lake_root on their own disks: refuse, unless it is shared."""
        master, remote = self._spark_place()
        shared = bool(self.config.get("lake_root_shared"))
        check_lake_reachable(lake.storage, shared=shared, master=master, remote=remote, words="setting")

    def _start_spark(self) -> SparkStarter:
        conf = conf_of_setting(self.config.get("spark_conf"))
        master, remote = self._spark_place()
        warm.wanted(self.config.get("spark_warm"))  # a bad value: say so now, in one line
        if remote is None:
            ensure_java()  # no Java: say so now, before any input is read or any stream is registered

        def start():
            return spark_session(
                master=master, app_name=f"target-singerlake {self._tap_id()}", conf=conf, remote=remote, warm=self.config.get("spark_warm")
            )

        # Spark of this machine starts once the input is more than a moment's, so a run whose input ended
        # before writes its one batch itself; user settings or someone else's cluster: fail before reading any input.
        eager = bool(conf) or not (remote is None and is_in_process_master(master))
        starter = SparkStarter(start, warm_up, defer_s=None if eager else LOCAL_START_DEFER_S)
        if conf or not self._on_this_machine():
            try:
                starter()
            except SparkStartError as exc:
                raise ConfigError(f"setting 'spark_conf' (or spark_master/spark_remote): {exc}") from exc
        return starter

    @property
    def work_id(self) -> str:
        """The run's work id: the setting, else Meltano's run id, else a new one (SPEC.md §5, §14)."""
        if getattr(self, "_work_id", None) is None:
            given = self.config.get("work_id")
            source = "setting 'work_id'" if given else "$MELTANO_RUN_ID"
            given = given or os.environ.get("MELTANO_RUN_ID", "").lower() or None
            if given is not None and (problem := label_problem("work_id", given)):
                raise ConfigError(f"{source}: {problem}")
            self._work_id = given or f"target-singerlake-{uuid.uuid4().hex[:16]}"
        return self._work_id

    def _landing_settings(self) -> LandingSettings:
        c = self.config
        return LandingSettings(
            tap_id=self._tap_id(),
            batch_max_rows=int(c.get("batch_max_rows", 100_000)),
            batch_max_bytes=int(c.get("batch_max_bytes", 32 << 20)),
            max_file_bytes=int(c.get("max_file_bytes", 256 << 20)),
            max_batch_age_s=float(c.get("max_batch_age_seconds", 300)),
            lock_wait_s=float(c.get("lock_wait_seconds", 600)),
            lock_lease_s=float(c.get("lock_lease_seconds", 60)),
            lock_drift_s=float(c.get("lock_drift_seconds", 10)),
            compresslevel=int(c.get("compression_level", 6)),
            validate_records=bool(c.get("validate_records", False)),
            work_id=self.work_id,
            annotations={name: c.get(name) for name in ANNOTATIONS},
            confirm_files=not self._on_this_machine(),
        )

    # -- running -----------------------------------------------------------------------------------
    def _emit_state(self, state: bytes) -> None:
        if not self._root_probed and not self.lander.drain.opened:
            self._probe_root()
        sys.stdout.write(state.decode("utf-8") + "\n")
        sys.stdout.flush()

    def process_endofpipe(self) -> None:
        try:
            self.lander.finish()
            if self.lander.drain.opened:  # the run wrote there: no probe for the next run on this machine
                proven.remember(self.lake.storage)
        except BaseException as exc:
            self.root_failed(exc)
            raise
        finally:
            self._stop_cluster_application()
        self._say_work_id()
        if self.interrupted:  # committed, STATE out; but the run did not end by itself
            raise SystemExit(INTERRUPTED_EXIT)

    def _say_work_id(self) -> None:
        """The one query that lists what this run landed."""
        whats = ",".join(sorted({normalise_label(stream) for stream in self.lander.schemas}))
        if whats:
            query = f"singerlake files {self.lake.storage.url} --what {whats} --work-id {self.work_id}"
            self.logger.info("work_id %s: what this run landed: %s", self.work_id, query)

    def _stop_cluster_application(self) -> None:
        """Stop a cluster application (local-cluster, spark://, k8s, yarn) so the cluster sees it finish.

        A driver that just exits looks lost to the cluster: local-cluster's workers then relaunch
        executors during shutdown and log the application as FAILED after a successful run.
        In-process local mode has nothing to tell and dies with the process (faster).
        """
        master, remote = self._spark_place()
        if remote or master == "local" or master.startswith("local["):
            return
        session = self.spark.started()
        if session is not None:
            try:
                stop_session(session, master)
            except Exception as exc:  # Spark already gone: the run's outcome is decided, only report it
                self.logger.warning("could not stop the Spark application: %s", exc)

    interrupted = False  # by Ctrl-C (SIGINT): the run then exits 130 once what was received is committed

    def _handle_termination(self, signum, frame) -> None:  # pragma: no cover - exercised by subprocess tests
        lander = getattr(self, "lander", None)
        if lander is None:
            raise SystemExit(128 + signum)
        if signum == signal.SIGINT:
            if self.interrupted:
                raise Interrupted("interrupted: stopped without committing the last batch")  # the second Ctrl-C
            self.interrupted = True
            self.logger.warning("Interrupted: committing what was received, then exiting 130 (Ctrl-C again: stop without committing)")
        else:
            self.logger.info("Received signal %d: stop reading, commit, emit STATE, exit", signum)
        lander.request_stop()


def _probe(storage) -> None:
    """A local root: made and written to (a temporary file; no request). An S3 root: HeadBucket, that
    the bucket exists and the credentials reach it; whether they may write, the run's first write says
    (SPEC.md §10)."""
    if proven.is_local(storage):
        storage.check_writable()
    elif not storage.root_exists():
        raise StorageError(f"lake root {storage.url}: bucket {storage.bucket!r} does not exist")


if __name__ == "__main__":
    TargetSingerlake.cli()
