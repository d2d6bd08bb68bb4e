"""The ``tap-singerlake`` command: the SDK's command line, with expected errors as one line and exit 2."""

from __future__ import annotations

import sys


def main() -> None:
    from singerlake.errors import run_command, sdk_cli_exit_code

    from tap_singerlake.tap import TapSingerlake

    sys.exit(run_command("tap-singerlake", lambda: sdk_cli_exit_code(TapSingerlake.cli)))


if __name__ == "__main__":
    main()
