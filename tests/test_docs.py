"""The documentation site (mkdocs.yml, docs/): built with warnings as errors, served on 127.0.0.1 and walked in
headless Chromium from its start page through every internal link: each page loads, each anchor a link names
is on its page, the generated reference covers every command and setting, and the browser fetches nothing
from outside."""

from __future__ import annotations

import http.server
import re
import subprocess
import sys
import threading
from functools import partial
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlparse

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.heavy  # a site build and a browser per page


class Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("href"):
            self.hrefs.append(attrs["href"])


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "site"
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert build.returncode == 0, build.stderr[-5000:]
    assert not re.search(r"^WARNING", build.stderr, re.M), build.stderr
    return out


@pytest.fixture(scope="module")
def served(site):
    """The built site over HTTP on 127.0.0.1, as a static host serves it; ``served.missing`` collects 404s."""
    missing: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def send_error(self, code, *args, **kwargs):
            missing.append(f"{code} {self.path}")
            super().send_error(code, *args, **kwargs)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server.missing = missing
    server.base = f"http://127.0.0.1:{server.server_address[1]}/"
    yield server
    server.shutdown()


def test_every_internal_link_opens_in_a_browser_and_lands_on_its_anchor(served, browser):
    browser.served.append(urlparse(served.base).netloc)
    pages: dict[str, Links] = {}
    wanted: list[tuple[str, str, str]] = []  # (from page, to page, anchor)
    queue = [served.base]
    while queue:
        url = queue.pop()
        if url in pages:
            continue
        parsed = Links()
        parsed.feed(browser(url, "--dump-dom"))
        pages[url] = parsed
        for href in parsed.hrefs:
            target, anchor = urldefrag(urljoin(url, href))
            if urlparse(target).netloc != urlparse(served.base).netloc:
                continue  # outside links are not followed (the proxy shows none is fetched)
            if target.endswith("/") or target.endswith(".html"):
                queue.append(target)
                if anchor:
                    wanted.append((url, target, anchor))
    assert len(pages) >= 20, sorted(pages)
    assert served.missing == [], served.missing
    broken = [(source, target, anchor) for source, target, anchor in wanted if anchor not in pages[target].ids]
    assert broken == [], broken[:10]
    assert browser.proxy.page_fetches() == [], sorted(set(browser.proxy.page_fetches()))


def test_the_reference_covers_every_command_and_setting(site):
    from singerlake.cli.main import parser
    from tap_singerlake.tap import TapSingerlake
    from target_singerlake.target import TargetSingerlake

    cli = (site / "reference" / "cli" / "index.html").read_text()
    commands = parser()._subparsers._group_actions[0].choices
    for name, command in commands.items():
        assert f'id="{name}"' in cli or command.prog.split()[-1] != name, name
        for action in command._actions:
            for flag in action.option_strings if action.help != "show this help message and exit" else ():
                assert f"<code>{flag}</code>" in cli, (name, flag)
    settings = (site / "reference" / "settings" / "index.html").read_text()
    for plugin in (TargetSingerlake, TapSingerlake):
        for name in plugin.declared_settings.to_dict()["properties"]:
            assert f"<code>{name}</code>" in settings, name
    spec = (site / "reference" / "spec" / "index.html").read_text()
    assert all(f'id="s{n}"' in spec for n in range(1, 16))


def test_the_start_page_shows_install_and_first_steps(served, browser, tmp_path):
    browser.served.append(urlparse(served.base).netloc)
    shot = tmp_path / "start.png"
    dom = re.sub(r"<[^>]+>", "", browser(served.base, "--dump-dom"))  # the text shown (code is highlighted token by token)
    assert "meltano add loader target-singerlake" in dom and "singerlake:project" in dom
    browser(served.base, f"--screenshot={shot}", "--window-size=1280,900")
    assert shot.stat().st_size > 10_000
