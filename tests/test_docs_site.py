"""`singerlake docs`: the static site, run as the real CLI and opened in headless Chromium (Debian's
`chromium`, installed by ./dev): every tap, stream, annotation and version is shown, names from the
wild stay text, the chart is there, and the browser fetches nothing from outside."""

from __future__ import annotations

import html
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path
from urllib.parse import urljoin

import pytest
from singerlake import Lake, SchemaWriter
from singerlake.commits.lock import Lock
from singerlake.format.layout import StreamPaths
from singerlake.format.names import encode_segment
from singerlake.format.schema_hash import schema_hash
from singerlake.site.pages import page_name, per_day
from singerlake.storage import LocalStorage, S3Storage
from support.browser import requested_host
from support.lakes import record_msg

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
    views = [name for name in pages if name.startswith("_singerlake/view-")]  # the site's views, one per tap (SPEC.md §16)
    assert len(views) == 2 and all(pages.pop(name) for name in views)
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
    views = [f"docs/_singerlake/view-{encode_segment(tap)}.json" for tap in (EVIL_TAP, PLAIN_TAP)]  # one per tap (SPEC.md §16)
    assert lake.keys("docs/") == sorted([*views, *(f"docs/{name}" for name in expected)])  # the stale page is gone
    assert {key[len(lake.root_prefix()) :].split("/")[0] for key in lake.everything()} == {"raw", "changes", "docs"}
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


# -- files (SPEC.md §14): a page per what ----------------------------------------------------------------
# (what, where, work_id, start, end, name): five photos over four days, two logs on a later day.
PUSHED = [
    ("photos", "cam-1", None, "2023-11-14T08:00:00Z", None, "a.jpg"),
    ("photos", "cam-1", None, "2023-11-14T12:00:00Z", "2023-11-14T13:00:00Z", "b.jpg"),
    ("photos", "cam-2", "night-1", "2023-11-14T23:30:00Z", "2023-11-15T00:30:00Z", "c.jpg"),  # over midnight
    ("photos", "cam-2", None, "2023-11-17T09:00:00Z", None, "d.jpg"),  # starts last, an instant
    ("photos", "cam-3", "long-1", "2023-11-16T00:00:00Z", "2023-11-17T10:00:00Z", "e.jpg"),  # ends last: the newest
    ("logs", "web-1", None, "2023-11-20T00:00:00Z", "2023-11-20T23:59:59Z", "access.log"),
    ("logs", "web-2", None, "2023-11-20T06:00:00Z", None, "error.log"),
]
PHOTOS_PER_DAY = [("2023-11-14", "3"), ("2023-11-15", "1"), ("2023-11-16", "1"), ("2023-11-17", "2")]
NEWEST_PHOTOS = ["e.jpg", "d.jpg", "c.jpg", "b.jpg", "a.jpg"]


def push_files(lake: Lake, source: Path) -> dict[str, dict]:
    """Push PUSHED (each file's bytes its own: its name repeated) and leave a push that never committed:
    a day pointer of 2023-11-25 whose segment was never written. Returns each name's record."""
    records = {}
    for what, where, work_id, start, end, name in PUSHED:
        path = source / what / where / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(name * (len(records) + 1))
        result = lake.push([path], what=what, where=where, work_id=work_id, start=start, end=end)
        records[name] = result.pushed[0]
    lake.storage.write("files/index/photos/day/2023-11-25/019ab1c2-0000-7000-8000-000000000000", b"")
    return records


def what_page_parts(page: str) -> dict:
    """The wheres table, the chart's bars and the latest files' rows of a what's page (HTML or a browser's DOM)."""
    return {
        "wheres": re.findall(
            r'<tr data-where="([^"]+)"><th scope="row">[^<]*</th><td class="n">(\d+)</td><td class="n">([^<]*)</td>', page
        ),
        "bars": re.findall(r'<rect class="bar"[^>]*data-day="([^"]+)" data-value="(\d+)"><title>([^<]*)</title></rect>', page),
        "latest": re.findall(r'<tr data-id="([0-9a-f]{32})">', page),
    }


def test_files_per_day_counts_a_file_in_each_day_it_spans_once_per_bar():
    from singerlake.site.pages import files_per_day

    night = {"start": 10 * DAY + 23 * 3_600_000, "end": 11 * DAY + 3_600_000}  # 23:00 on day 10 to 01:00 on day 11
    instant = {"start": 12 * DAY + 5, "end": None}
    bars, days = files_per_day([night, instant])
    assert days == 1 and [(b["day"], b["files"]) for b in bars] == [("1970-01-11", 1), ("1970-01-12", 1), ("1970-01-13", 1)]
    years = {"start": 0, "end": 999 * DAY}  # a long life: bars of 3 days, the file once in each
    bars, days = files_per_day([years, instant])
    assert days == 3 and len(bars) == 334 and all(b["files"] == 1 for b in bars[:4] + bars[5:]) and bars[4]["files"] == 2


def test_a_what_page_lists_its_wheres_charts_files_per_day_and_shows_the_newest_first(tmp_path, monkeypatch):
    from singerlake.site import pages as site_module

    lake = Lake(LocalStorage(tmp_path / "lake"))
    land_core(lake, PLAIN_TAP, "users", V1, [0])
    records = push_files(lake, tmp_path / "in")
    monkeypatch.setattr(site_module, "MAX_FILE_ROWS", 4)
    site = site_module.build_site(lake)
    assert site.streams == 1 and site.whats == 2 and site.problems == []
    assert sorted(site.pages) == sorted(["index.html", page_name(PLAIN_TAP, "users"), "files/logs.html", "files/photos.html"])

    photos = site.pages["files/photos.html"].decode()
    parts = what_page_parts(photos)
    size = {name: f"{r['size']} B" for name, r in records.items()}
    assert [(where, n) for where, n, _ in parts["wheres"]] == [("cam-1", "2"), ("cam-2", "2"), ("cam-3", "1")]
    assert parts["wheres"][0][2] == f"{records['a.jpg']['size'] + records['b.jpg']['size']} B" and parts["wheres"][2][2] == size["e.jpg"]
    # c.jpg (23:30 to 00:30) counts on the 14th and the 15th; the uncommitted pointer of the 25th is not a file
    assert [(day, n) for day, n, _ in parts["bars"]] == PHOTOS_PER_DAY
    assert [title for _, _, title in parts["bars"]] == [
        "2023-11-14: 3 files",
        "2023-11-15: 1 file",
        "2023-11-16: 1 file",
        "2023-11-17: 2 files",
    ]
    assert 'aria-label="Files per day, 2023-11-14 to 2023-11-17, highest 3"' in photos
    assert parts["latest"] == [records[name]["id"] for name in NEWEST_PHOTOS[:4]] and "The newest 4 of 5 files" in photos
    first_row = re.search(r'<tr data-id="[0-9a-f]{32}">(.*?)</tr>', photos).group(1)
    assert ">cam-3<" in first_row and ">e.jpg<" in first_row and ">long-1<" in first_row and '"2023-11-17T10:00:00.000Z"' in first_row
    assert "<dt>Files</dt><dd>5 (" in photos and "<dt>Wheres</dt><dd>3</dd>" in photos and "<dt>Pushes</dt><dd>5</dd>" in photos

    logs = what_page_parts(site.pages["files/logs.html"].decode())
    assert [(w, n) for w, n, _ in logs["wheres"]] == [("web-1", "1"), ("web-2", "1")] and [(d, n) for d, n, _ in logs["bars"]] == [
        ("2023-11-20", "2")
    ]

    index = site.pages["index.html"].decode()
    assert f"<h2>{PLAIN_TAP}</h2>" in index and "pushed files of 2 whats" in index
    whats = re.findall(
        r'<tr data-search="([^"]*)" data-kind="what">\s*<th scope="row"><a href="([^"]+)">([^<]+)</a></th>\s*'
        r'<td class="n">(\d+)</td><td class="n">(\d+)</td><td class="n wide">[^<]*</td>\s*'
        r'<td class="times"><time datetime="([^"]+)">[^<]*</time></td><td class="times"><time datetime="([^"]+)">',
        index,
    )
    assert whats == [
        ("logs web-1 web-2", "files/logs.html", "logs", "2", "2", "2023-11-20", "2023-11-20"),
        ("photos cam-1 cam-2 cam-3", "files/photos.html", "photos", "5", "3", "2023-11-14", "2023-11-17"),
    ]


def test_what_pages_open_from_the_index_in_a_browser_with_their_chart_and_latest_files_and_fetch_nothing(tmp_path, browser):
    root, site = tmp_path / "lake", tmp_path / "site"
    lake = Lake(LocalStorage(root))
    land_core(lake, PLAIN_TAP, "users", V1, [0, 1])
    records = push_files(lake, tmp_path / "in")
    run = docs(root, "--out", str(site))
    assert run.returncode == 0, run.stderr
    assert "4 pages (1 stream, 2 whats of files)" in run.stdout
    for path in site.rglob("*.html"):  # nothing on a page loads anything
        assert not re.search(r"\ssrc=|<link|url\(|@import", path.read_text("utf-8")), path

    index_url = (site / "index.html").as_uri()
    index = browser(index_url, "--dump-dom")
    assert "1 of 1 streams, 2 of 2 whats" in index
    link = re.search(r'<a href="([^"]+)">photos</a>', index)
    assert link, index
    page_url = urljoin(index_url, html.unescape(link.group(1)))
    assert page_url == (site / "files" / "photos.html").as_uri()

    photos = browser(page_url, "--dump-dom")
    parts = what_page_parts(photos)
    assert [(day, n) for day, n, _ in parts["bars"]] == PHOTOS_PER_DAY
    assert parts["latest"] == [records[name]["id"] for name in NEWEST_PHOTOS]
    assert [where for where, _, _ in parts["wheres"]] == ["cam-1", "cam-2", "cam-3"]
    back = re.search(r'<nav aria-label="Breadcrumb"><a href="([^"]+)">Lake</a>', photos)
    assert back and urljoin(page_url, back.group(1)) == index_url

    # The search box finds whats by name or where: ?q=cam-2 keeps photos, hides logs and the stream.
    searched = browser(index_url + "?q=cam-2", "--dump-dom")
    shown = dict(re.findall(r'<tr data-search="([^"]*)" data-kind="what"( hidden="")?>', searched))
    assert shown == {"logs web-1 web-2": ' hidden=""', "photos cam-1 cam-2 cam-3": ""} and "0 of 1 streams, 1 of 2 whats" in searched

    browser(page_url, "--window-size=390,2400", f"--screenshot={tmp_path / 'what-phone.png'}")
    assert png_size(tmp_path / "what-phone.png") == (390, 2400)
    print(f"screenshot: {tmp_path / 'what-phone.png'}")
    assert browser.proxy.page_fetches() == [], browser.proxy.page_fetches()


def test_a_lake_of_files_alone_gets_a_site_over_the_cli(tmp_path):
    root, site = tmp_path / "lake", tmp_path / "site"
    lake = Lake(LocalStorage(root))
    records = push_files(lake, tmp_path / "in")
    assert not (root / "raw").exists()
    lake.storage.write("docs/files/gone.html", b"<p>a what no longer in the lake</p>")
    lake.storage.write("docs/files/deeper/kept.html", b"<p>not a page of the site</p>")

    run = docs(root, "--out", str(site), "--publish", "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert (report["pages"], report["streams"], report["whats"], report["failures"]) == (3, 0, 2, [])
    assert sorted(p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file()) == [
        "files/logs.html",
        "files/photos.html",
        "index.html",
    ]
    assert [info.key for info in lake.storage.list("docs/")] == [
        "docs/files/deeper/kept.html",
        "docs/files/logs.html",
        "docs/files/photos.html",
        "docs/index.html",
    ]
    index = (site / "index.html").read_text()
    assert "0 taps, 0 streams; pushed files of 2 whats" in index and 'href="files/photos.html"' in index
    assert records["e.jpg"]["id"] in (site / "files" / "photos.html").read_text()

    run = docs(root, "--out", str(site))  # the text report names the whats
    assert run.returncode == 0 and "3 pages (0 streams, 2 whats of files)" in run.stdout, run.stderr
    (tmp_path / "empty").mkdir()
    run = docs(tmp_path / "empty", "--out", str(site))
    assert run.returncode == 2 and "neither files/ nor raw/" in run.stderr and "Traceback" not in run.stderr

    segment = next((root / "files/index/logs/segments").iterdir())
    segment.write_bytes(b"not a gzip")  # a damaged what: its page and the run say so, the other what is built
    run = docs(root, "--out", str(site))
    assert run.returncode == 1 and "failed: files of what 'logs': " in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert "not a gzip of JSON" in (site / "files" / "logs.html").read_text()
    assert records["e.jpg"]["id"] in (site / "files" / "photos.html").read_text()
