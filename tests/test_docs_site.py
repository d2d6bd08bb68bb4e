"""`singerlake docs`: the static site, run as the real CLI and opened in headless Chromium (Debian's
`chromium`, installed by ./dev): every tap, stream, annotation and version is shown, names from the
wild stay text, the chart is there, and the browser fetches nothing from outside."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from lakes import record_msg
from singerlake import Lake, SchemaWriter
from singerlake.commits.lock import Lock
from singerlake.format.layout import StreamPaths
from singerlake.format.schema_hash import schema_hash
from singerlake.jobs.site import page_name, per_day
from singerlake.storage import LocalStorage, S3Storage

CLI = [sys.executable, "-m", "singerlake.cli"]
DAY = 86_400_000
T0 = 1_700_000_000_000  # 2023-11-14

EVIL_TAP = "../../escape me ü"
SCRIPT_STREAM = "<script>alert('stream')</script>"
ORDERS = "public.orders"
ANNOTATIONS = {
    "owner": "Data <b>Platform</b> team",
    "description": "Orders & users <script>alert('description')</script>",
    "docs_url": "https://docs.example.com/tap?x=1&y=<2>",
    "logs_url": "javascript:alert('logs')",
}
PLAIN_TAP = "tap-plain"
PLAIN_STREAMS = ["users", "events"]
V1 = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": ["string", "null"]}}}
V2 = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "email": {"type": "string"},
        "address": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def land_core(lake: Lake, tap: str, stream: str, schema: dict, days: list[int], per_file: int = 3, annotations=None) -> None:
    """One commit per day in ``days`` (days after T0), written with the core."""
    message = {"type": "SCHEMA", "stream": stream, "schema": schema, "key_properties": ["id"]}
    with SchemaWriter(lake, tap, message, annotations=annotations) as writer:
        for day in days:
            lines = [record_msg(stream, {"id": day * 100 + i}) for i in range(per_file)]
            times = [T0 + day * DAY + i * 1000 for i in range(per_file)]
            writer.commit([writer.write_file(lines, times)])


def hostile_lake(storage) -> Lake:
    """Hostile names, two schema versions of one stream, annotations with markup and a javascript: link."""
    lake = Lake(storage)
    land_core(lake, EVIL_TAP, ORDERS, V1, [0, 1, 2], annotations=ANNOTATIONS)
    land_core(lake, EVIL_TAP, ORDERS, V2, [3, 5], per_file=5)
    land_core(lake, EVIL_TAP, SCRIPT_STREAM, V1, [0])
    for stream in PLAIN_STREAMS:
        land_core(lake, PLAIN_TAP, stream, V1, [0, 1])
    return lake


def docs(root, *args: str, s3: dict | None = None) -> subprocess.CompletedProcess:
    options = [f"--s3-{name.replace('_', '-')}={value}" for name, value in (s3 or {}).items() if name in ("endpoint_url", "region")]
    env = None
    if s3:
        env = {**os.environ, "AWS_ACCESS_KEY_ID": s3["access_key_id"], "AWS_SECRET_ACCESS_KEY": s3["secret_access_key"]}
    return subprocess.run([*CLI, "docs", str(root), *options, *args], capture_output=True, text=True, timeout=600, env=env)


# -- the browser -----------------------------------------------------------------------------------
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
                "--disable-features=NetworkTimeServiceQuerying,OptimizationHints,MediaRouter,Translate",
                "--disable-extensions",
                "--hide-scrollbars",
                f"--user-data-dir={tmp_path / 'chromium-profile'}",
                f"--proxy-server=http://127.0.0.1:{proxy.port}",
                "--proxy-bypass-list=<-loopback>",
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
    yield browse
    proxy.close()


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def rows_shown(dom: str) -> dict[str, bool]:
    """Each index row's search text -> whether it is shown (not ``hidden``) after the page's script ran."""
    return {html.unescape(text): not hidden for text, hidden in re.findall(r'<tr data-search="([^"]*)"( hidden="")?>', dom)}


# -- tests -------------------------------------------------------------------------------------------
def test_page_names_are_safe_and_unique_for_wild_names():
    names = [("t", "public.Users"), ("t", "public.users"), ("a.b", "c"), ("a", "b.c"), (EVIL_TAP, "../x"), ("t", "名前 " * 80)]
    pages = [page_name(tap, stream) for tap, stream in names]
    assert len(set(pages)) == len(pages)
    for page in pages:
        directory, name = page.split("/")
        assert directory == "streams" and re.fullmatch(r"[a-z0-9_~-]+\.[a-z0-9_~-]+\.html", name) and len(name) <= 255, page


def test_a_file_spanning_days_is_charted_over_them_by_time():
    # 1,000 records from 18:00 on day 0 to 06:00 on day 2: a quarter, a half, a quarter of the time.
    start = 10 * DAY + 18 * 3_600_000
    bars, days = per_day([{"start": start, "end": start + DAY + DAY // 2, "records": 1000, "size": 400}])
    assert days == 1 and [round(b["records"]) for b in bars] == [167, 667, 167] and sum(b["bytes"] for b in bars) == pytest.approx(400)
    assert [b["label"] for b in bars] == ["1970-01-11", "1970-01-12", "1970-01-13"]


def test_site_shows_every_tap_stream_annotation_and_version_in_a_browser_and_fetches_nothing(tmp_path, browser):
    root, site = tmp_path / "lake", tmp_path / "site"
    lake = hostile_lake(LocalStorage(root))
    held = Lock(lake.storage, StreamPaths(PLAIN_TAP, "users").lock(schema_hash(V1, ["id"])), lease_s=3600).acquire()
    events = lake.manifest(PLAIN_TAP, "events").files[0]["path"]
    damaged = bytearray((root / events).read_bytes())
    damaged[-5] ^= 0xFF  # same size, other bytes: only the hash check of `singerlake verify` finds it
    (root / events).write_bytes(bytes(damaged))
    try:
        run = docs(root, "--out", str(site), "--verify", "--spark-master", "local[2]")
    finally:
        held.release()
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr and "5 pages (4 streams)" in run.stdout

    pages = {path.relative_to(site).as_posix(): path.read_text("utf-8") for path in site.rglob("*") if path.is_file()}
    assert sorted(pages) == sorted(
        ["index.html"] + [page_name(EVIL_TAP, s) for s in (ORDERS, SCRIPT_STREAM)] + [page_name(PLAIN_TAP, s) for s in PLAIN_STREAMS]
    )
    for text in pages.values():  # nothing on a page loads anything: no src, no stylesheet link, no CSS url()
        assert not re.search(r"\ssrc=|<link|url\(|@import", text)

    index = browser((site / "index.html").as_uri(), "--dump-dom")
    for text in [
        EVIL_TAP,
        SCRIPT_STREAM,
        ORDERS,
        PLAIN_TAP,
        *PLAIN_STREAMS,
        ANNOTATIONS["owner"],
        ANNOTATIONS["description"],
        ANNOTATIONS["logs_url"],
    ]:
        assert html.escape(text, quote=False) in index, text
    docs_link = re.search(r'<a href="([^"]*)"[^>]*>' + re.escape(html.escape(ANNOTATIONS["docs_url"], quote=False)) + "</a>", index)
    assert docs_link and html.unescape(docs_link.group(1)) == ANNOTATIONS["docs_url"]
    assert "javascript:" not in " ".join(re.findall(r'href="([^"]*)"', index))  # the logs annotation is text, not a link
    assert index.count("<script") == 1  # ours; the names and the description stayed text
    assert "4 of 4 streams" in index
    assert re.search(r"events</a></th>(?:(?!</tr>).)*1 problem</span>", index, re.S) and index.count(">clean</span>") == 3

    # The search box filters as you type; ?q= fills it, from file:// without any server.
    shown = rows_shown(browser((site / "index.html").as_uri() + "?q=ORDERS", "--dump-dom"))
    assert shown == {
        f"{EVIL_TAP} {SCRIPT_STREAM} data <b>platform</b> team".lower(): False,
        f"{EVIL_TAP} {ORDERS} data <b>platform</b> team".lower(): True,
        f"{PLAIN_TAP} users ": False,
        f"{PLAIN_TAP} events ": False,
    }

    orders = browser((site / page_name(EVIL_TAP, ORDERS)).as_uri(), "--dump-dom")
    for text in ("v1", "v2", "address.city", "19", "Key properties", EVIL_TAP):
        assert html.escape(text, quote=False) in orders, text
    assert re.search(r"<ins>\+ <code>email</code>: string</ins>", orders) and re.search(
        r"<del>− <code>name</code>: string\|null</del>", orders
    )
    bars = re.findall(r'<rect class="bar"[^>]*><title>([^<]*)</title>', orders)
    assert bars[:6] == ["2023-11-14: 3 records", "2023-11-15: 3 records", "2023-11-16: 3 records", "2023-11-17: 5 records",
                        "2023-11-18: 0 records", "2023-11-19: 5 records"]  # fmt: skip
    assert len(bars) == 12 and "Records per day of record time" in orders and "Bytes per day of record time" in orders

    script_page = browser((site / page_name(EVIL_TAP, SCRIPT_STREAM)).as_uri(), "--dump-dom")
    assert f"<h1>{html.escape(SCRIPT_STREAM, quote=False)}</h1>" in script_page and "<script" not in script_page
    users = browser((site / page_name(PLAIN_TAP, "users")).as_uri(), "--dump-dom")
    assert held.writer_id in users and "No locks held" not in users
    events_page = browser((site / page_name(PLAIN_TAP, "events")).as_uri(), "--dump-dom")
    assert "hash_mismatch" in events_page and html.escape(events) in events_page

    for size, name in (("1280,1900", "stream-desktop.png"), ("390,2400", "stream-phone.png")):
        browser((site / page_name(EVIL_TAP, ORDERS)).as_uri(), f"--window-size={size}", f"--screenshot={tmp_path / name}")
        assert png_size(tmp_path / name) == tuple(int(n) for n in size.split(","))
        print(f"screenshot: {tmp_path / name}")
    assert browser.proxy.page_fetches() == [], browser.proxy.page_fetches()

    # The probe itself sees a page that does fetch from outside (the request only reaches the proxy on loopback).
    control = tmp_path / "control.html"
    control.write_text('<img src="http://fetched.example/pixel.png">')
    browser(control.as_uri(), "--dump-dom")
    assert {requested_host(r) for r in browser.proxy.page_fetches()} == {"fetched.example"}, browser.proxy.requests


def docs_on(lake, *args: str) -> subprocess.CompletedProcess:
    config = lake.config
    if lake.kind == "local":
        return docs(config["lake_root"], *args)
    s3 = {
        "endpoint_url": config["s3_endpoint_url"],
        "region": config["s3_region"],
        "access_key_id": config["s3_access_key_id"],
        "secret_access_key": config["s3_secret_access_key"],
    }
    return docs(config["lake_root"], *args, s3=s3)


def test_publish_writes_the_site_under_the_lake_root_from_metadata_alone(lake):
    hostile_lake(lake.storage)
    lake.storage.write("docs/streams/tap-gone.gone.html", b"<p>a stream no longer in the lake</p>")
    data_files = lake.data_keys()
    for key in data_files:  # the site needs none of them: it is built from the metadata
        lake.storage.delete(key)

    run = docs_on(lake, "--publish")
    assert run.returncode == 0, run.stderr
    expected = ["index.html"] + [page_name(EVIL_TAP, s) for s in (ORDERS, SCRIPT_STREAM)] + [page_name(PLAIN_TAP, s) for s in PLAIN_STREAMS]
    assert lake.keys("docs/") == sorted(f"docs/{name}" for name in expected)  # the stale page is gone
    assert {key[len(lake.root_prefix()) :].split("/")[0] for key in lake.everything()} == {"raw", "docs"}
    orders = lake.read(f"docs/{page_name(EVIL_TAP, ORDERS)}").decode()
    assert "<dt>Records</dt><dd>19</dd>" in orders and ">v2 <code" in orders
    index = lake.read("docs/index.html").decode()
    assert "&lt;script&gt;alert(" in index and "<script>alert" not in index
    if isinstance(lake.storage, S3Storage):  # a static website on the bucket serves the pages as HTML
        head = lake.storage.client.head_object(Bucket=lake.storage.bucket, Key=lake.storage.prefix + "docs/index.html")
        assert head["ContentType"] == "text/html; charset=utf-8"


def test_docs_reports_usage_errors_in_one_line_and_a_stream_without_manifest_by_name(tmp_path):
    root, site = tmp_path / "lake", tmp_path / "site"
    lake = hostile_lake(LocalStorage(root))

    for args, says in (
        ([], "say where the site goes: --out DIR, --publish"),
        (["--out", str(tmp_path / "a-file")], "cannot write"),
    ):
        (tmp_path / "a-file").write_text("not a directory")
        run = docs(root, *args)
        assert run.returncode == 2 and says in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    run = docs(tmp_path / "no-lake", "--out", str(site))
    assert run.returncode == 2 and "does not exist" in run.stderr and "Traceback" not in run.stderr

    missing = StreamPaths(PLAIN_TAP, "users").manifest
    lake.storage.delete(missing)
    run = docs(root, "--out", str(site), "--json")
    assert run.returncode == 1, run.stderr
    assert run.stderr.splitlines()[0].startswith(f"singerlake docs: failed: tap '{PLAIN_TAP}', stream 'users': ")
    assert "manifest.json is missing" in run.stderr and "Traceback" not in run.stderr
    report = json.loads(run.stdout)
    assert report["streams"] == 4 and [(f["tap_id"], f["stream"]) for f in report["failures"]] == [(PLAIN_TAP, "users")]
    page = (site / page_name(PLAIN_TAP, "users")).read_text()
    assert "manifest.json is missing" in page
    assert not lake.storage.exists(missing)  # reported, not rebuilt by a scan of the data files
    assert "<dt>Records</dt><dd>6</dd>" in (site / page_name(PLAIN_TAP, "events")).read_text()
