"""Named places where a test holds a process between two steps (as etcd's gofail failpoints do).

``SINGERLAKE_PAUSE_AT=<name>`` makes the process stop itself (SIGSTOP) the first time it reaches
``pause_point(name)``, after one line on stderr saying so; a test then acts on the lake while the
writer is held there, and lets it go on with SIGCONT. Unset (always, outside tests), it costs one
dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import sys

_REACHED: set[str] = set()


def pause_point(name: str) -> None:
    if os.environ.get("SINGERLAKE_PAUSE_AT") != name or name in _REACHED:
        return
    _REACHED.add(name)
    print(f"singerlake: paused at {name} (pid {os.getpid()}); SIGCONT to go on", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
