"""moto's S3 server with each write applied atomically: ``python moto_atomic.py HOST PORT``.

moto 5.2.5 checks a PUT's or DELETE's If-None-Match / If-Match and then applies it, on one of its
request threads, with nothing between the two. Two creators of one key can both pass the check
and both "win" (seen as a lock held twice: 13 of 300 eight-way races once the interpreter switched
threads often). S3 and SeaweedFS apply a conditional write atomically, and the lake relies on that
(SPEC.md §8), so the tests' moto handles one write (PUT, POST, DELETE) at a time; reads stay parallel.
"""

from __future__ import annotations

import signal
import sys
import threading

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple

WRITES = {"PUT", "POST", "DELETE"}


def one_write_at_a_time(app):
    lock = threading.Lock()

    def serve(environ, start_response):
        if environ["REQUEST_METHOD"] not in WRITES:
            return app(environ, start_response)
        with lock:
            return list(app(environ, start_response))  # the whole response is made under the lock

    return serve


def main(host: str, port: int) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(host, port, one_write_at_a_time(app), threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
