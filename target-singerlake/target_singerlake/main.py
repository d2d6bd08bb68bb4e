"""The ``target-singerlake`` command: the Spark driver JVM boots while the SDK is still being imported.

A small run's wall time is mostly the JVM's start-up, so it begins first, from the master named in
the ``--config`` files (read here with nothing but ``json``). The SDK then parses the same settings
as always; ``spark_session`` adopts the running JVM. Anything unusual (Spark Connect, extra
``spark_conf``, settings from the environment, ``--about``) skips the early start.

When the run is over (STATE written, locks released), the process ends without tearing down the
interpreter: the JVM gateway's threads and Spark's shutdown are work nobody waits for.
"""

from __future__ import annotations

import json
import logging
import os
import sys

from singerlake.settings import config_paths

EARLY_START_SKIPPED_BY = {"--about", "--help", "--version", "--discover", "--test"}


def local_master_from_argv(argv: list[str]) -> str | None:
    """The local Spark master a plain run will use, or None when the early start should not guess."""
    if (
        EARLY_START_SKIPPED_BY & set(argv)
        or "SPARK_REMOTE" in os.environ
        or any(name.startswith("TARGET_SINGERLAKE_") for name in os.environ)
    ):
        return None
    config: dict = {}
    for path in config_paths(argv):
        try:
            with open(path, encoding="utf-8") as handle:
                loaded = json.load(handle)
        except (OSError, ValueError):
            return None  # ENV, or a file the SDK will report on
        if not isinstance(loaded, dict):
            return None
        config.update(loaded)
    master = config.get("spark_master") or "local[*]"
    warm = config.get("spark_warm", os.environ.get("SINGERLAKE_SPARK_WARM", ""))
    if str(warm).lower() in ("1", "true", "yes", "on"):  # the machine's warm Spark runs it: no JVM of this run's own
        return None
    if config.get("spark_remote") or config.get("spark_conf") or not isinstance(master, str) or not master.startswith("local"):
        return None
    return master


def main() -> None:
    master = local_master_from_argv(sys.argv[1:])
    if master is not None:
        from singerlake.spark.session import prelaunch

        prelaunch(master)
    from singer_sdk.exceptions import MissingKeyPropertiesError, RecordsWithoutSchemaException
    from singerlake.errors import run_command, sdk_cli_exit_code
    from singerlake.settings import check_config_files

    from target_singerlake.target import TargetSingerlake

    # Expected errors (settings, input, storage, landing) are one line and exit 2 (SINGERLAKE_DEBUG=1: with the traceback).
    def run() -> int:
        check_config_files(sys.argv[1:])
        return sdk_cli_exit_code(TargetSingerlake.cli)

    code = run_command("target-singerlake", run, expected=(RecordsWithoutSchemaException, MissingKeyPropertiesError))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
