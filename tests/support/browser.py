"""Headless Chromium (Debian's `chromium`, installed by ./dev) for the pages a person looks at: ``browser(url, *flags)``
runs it on a page with every request it makes going to a recording proxy on 127.0.0.1, so a test sees any
fetch from outside."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import threading

import pytest


def find_chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip("Chromium is not installed: ./dev installs Debian's chromium package with apt-get when it runs as root")
    return found


# Chromium's own service traffic (component updates, sign-in, network time), which some of it makes on
# every start whatever the flags; exact host names, so a page asset on any other host is still seen.
CHROMIUM_SERVICES = {"update.googleapis.com", "accounts.google.com", "clients2.google.com"}


def requested_host(request_line: str) -> str:
    """``CONNECT host:443 HTTP/1.1`` or ``GET http://host/path HTTP/1.1`` -> ``host``."""
    target = request_line.split(" ")[1]
    return re.sub(r"^[a-z]+://", "", target).split("/")[0].rsplit(":", 1)[0]


class RecordingProxy:
    """An HTTP proxy on 127.0.0.1 that only writes down what a browser asks it for (and answers 502):
    with Chromium pointed at it, any fetch from outside would show up here."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    line = conn.recv(4096).split(b"\r\n", 1)[0].decode("latin-1")
                    if line:  # a connection opened and closed unused (a pre-connect) asks for nothing
                        self.requests.append(line)
                    conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass

    def page_fetches(self) -> list[str]:
        return [request for request in self.requests if requested_host(request) not in CHROMIUM_SERVICES]

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def browser(tmp_path):
    """``browse(url, *flags)``: headless Chromium on a page, every request it makes going to a recording proxy."""
    chromium = find_chromium()
    proxy = RecordingProxy()

    def browse(url: str, *flags: str) -> str:
        bypass = ";".join(["<-loopback>", *browse.served])  # loopback goes to the proxy too, but for our own servers
        run = subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-features=NetworkTimeServiceQuerying,OptimizationHints,MediaRouter,Translate,AutofillServerCommunication",
                "--disable-extensions",
                "--hide-scrollbars",
                f"--user-data-dir={tmp_path / 'chromium-profile'}",
                f"--proxy-server=http://127.0.0.1:{proxy.port}",
                f"--proxy-bypass-list={bypass}",
                *flags,
                url,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr[-2000:]
        return run.stdout

    browse.proxy = proxy
    browse.served = []  # host:port of servers the test itself started, reached directly
    yield browse
    proxy.close()
