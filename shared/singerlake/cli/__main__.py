"""``python -m singerlake.cli``: the ``singerlake`` command."""

import sys

from singerlake.cli.main import main

sys.exit(main())
