"""The ``tap-singerlake`` command: the SDK's command line, with expected errors as one line and exit 2."""

from __future__ import annotations

import sys


def main() -> None:
    from singerlake.errors import run_command, sdk_cli_exit_code
    from singerlake.settings import check_config_files

    from tap_singerlake.tap import TapSingerlake

    def run() -> int:
        check_config_files(sys.argv[1:])
        return sdk_cli_exit_code(TapSingerlake.cli)

    sys.exit(run_command("tap-singerlake", run))


if __name__ == "__main__":
    main()
