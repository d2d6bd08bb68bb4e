"""``singerlake docs``: the lake as a static HTML site, built from its metadata only (SPEC.md §12):
a page per Singer stream and per what of pushed files (SPEC.md §14), and an index of both.

Pages come from Jinja2 templates with autoescape, so every name, annotation and schema from the
wild is shown as text, never read as markup. Each page carries its CSS and its one small script
inline, allowed by hash in a Content-Security-Policy that forbids everything else: the site reads
the same from ``file://`` and any static host, and a browser fetches nothing from outside for it.
"""

from __future__ import annotations

import base64
import hashlib
import math
from dataclasses import dataclass, field
from importlib import resources
from urllib.parse import urlparse

import jinja2
from markupsafe import Markup

from singerlake.errors import one_line
from singerlake.files import index as files_index
from singerlake.files.record import last_time, newness
from singerlake.format.names import encode_segment
from singerlake.jobs.describe import describe_stream, schema_changes, type_text
from singerlake.jobs.verify import Finding, read_manifest
from singerlake.lake import Lake
from singerlake.spark.runner import Failures, StreamFailure, StreamId, for_each_stream
from singerlake.storage import NotFound, Storage
from singerlake.tables.columns import published_table
from singerlake.times import file_id_ms, iso_ms, now_ms

SITE_PREFIX = "docs/"  # where --publish puts the site under the lake root
INDEX = "index.html"
STREAM_PAGES = "streams/"
FILE_PAGES = "files/"  # a page per what of pushed files (SPEC.md §14)
HTML = "text/html; charset=utf-8"
DAY_MS = 86_400_000
MAX_BARS = 366  # a longer life is charted in bars of several days
MAX_ROWS = 200  # newest files and commits listed on a stream page
MAX_FILE_ROWS = 50  # latest files listed on a what's page
MAX_SCHEMA_DEPTH = 8
LINKS = (("docs", "docs_url"), ("logs", "logs_url"))  # annotations shown as links (the target's settings of those names)
PLOT_LEFT, PLOT_RIGHT, PLOT_BOTTOM, PLOT_HEIGHT = 64, 600, 140, 126  # chart area in the SVG's viewBox


@dataclass
class Site:
    pages: dict[str, bytes]  # relative name -> HTML, stream and what pages first, the index last
    streams: int
    problems: list[StreamFailure | WhatFailure] = field(default_factory=list)
    whats: int = 0


@dataclass
class WhatFailure:
    """A what of pushed files whose index could not be read, and why (reported like a failed stream)."""

    what: str
    cause: str

    def __str__(self) -> str:
        return f"files of what {self.what!r}: {self.cause}"

    def to_dict(self) -> dict:
        return {"what": self.what, "cause": self.cause}


@dataclass
class VerifyResult:
    """What ``singerlake verify`` found, to show beside each stream."""

    findings: list[Finding]
    failures: list[StreamFailure]


def page_name(tap_id: str, stream: str) -> str:
    """``streams/<tap>.<stream>.html`` from the names' path segments (SPEC.md §2): segments never hold
    ``.``, so the name is unique, and they hold only ``[a-z0-9_~-]``, so it is safe anywhere."""
    return f"{STREAM_PAGES}{encode_segment(tap_id)}.{encode_segment(stream)}.html"


def what_page_name(what: str) -> str:
    """``files/<what>.html``: a what is ``[a-z0-9_-]+`` (SPEC.md §14), kept as it is by ``encode_segment``;
    a directory under ``files/index/`` named otherwise by hand is encoded, so its page name is still safe."""
    return f"{FILE_PAGES}{encode_segment(what)}.html"


# -- what a page shows -------------------------------------------------------------------------------
def safe_link(url: object) -> str | None:
    """Annotations are links only when they are http(s) URLs (never ``javascript:`` and the like)."""
    return url if isinstance(url, str) and urlparse(url).scheme in ("http", "https") and urlparse(url).netloc else None


def age_text(then_ms: int, now: int) -> str:
    seconds = max(0, (now - then_ms) // 1000)
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return "just now"


def schema_rows(schema: dict, prefix: str = "", depth: int = 0) -> list[dict]:
    """The properties of a JSON schema as table rows, nested ones under their parent (``a.b``, ``tags[].x``)."""
    rows: list[dict] = []
    properties = schema.get("properties")
    if not isinstance(properties, dict) or depth > MAX_SCHEMA_DEPTH:
        return rows
    required = schema.get("required") if isinstance(schema.get("required"), list) else []
    for name, spec in properties.items():
        spec = spec if isinstance(spec, dict) else {}
        rows.append({"name": prefix + name, "depth": depth, "type": type_text(spec), "required": name in required})
        rows += schema_rows(spec, f"{prefix}{name}.", depth + 1)
        if isinstance(spec.get("items"), dict):
            rows += schema_rows(spec["items"], f"{prefix}{name}[].", depth + 1)
    return rows


def per_day(files: list[dict]) -> tuple[list[dict], int]:
    """Records and bytes per UTC day of record time over the stream's life, in bars of one day (or
    several, for a life longer than MAX_BARS days: the second value). A file spanning days is spread
    over them by time."""
    if not files:
        return [], 1
    first, last = min(f["start"] for f in files) // DAY_MS, max(f["end"] for f in files) // DAY_MS
    days = math.ceil((last - first + 1) / MAX_BARS)
    bars = [{"records": 0.0, "bytes": 0.0} for _ in range((last - first) // days + 1)]
    for entry in files:
        span = entry["end"] - entry["start"]
        for day in range(entry["start"] // DAY_MS, entry["end"] // DAY_MS + 1):
            overlap = min(entry["end"], (day + 1) * DAY_MS) - max(entry["start"], day * DAY_MS)
            share = overlap / span if span else 1.0
            bar = bars[(day - first) // days]
            bar["records"] += entry["records"] * share
            bar["bytes"] += entry["size"] * share
    return _labelled(bars, first, days), days


def _labelled(bars: list[dict], first: int, days: int) -> list[dict]:
    for index, bar in enumerate(bars):
        start = (first + index * days) * DAY_MS
        bar["day"] = iso_ms(start)[:10]
        bar["label"] = bar["day"] + (f" + {days} days" if days > 1 else "")
    return bars


def files_per_day(records: list[dict]) -> tuple[list[dict], int]:
    """Pushed files per UTC day of their span, in bars of one day (or several, as ``per_day``): a file
    counts once in each bar its span (``start`` to ``end``, or ``start`` alone) overlaps."""
    if not records:
        return [], 1
    first, last = min(r["start"] for r in records) // DAY_MS, max(last_time(r) for r in records) // DAY_MS
    days = math.ceil((last - first + 1) / MAX_BARS)
    bars = [{"files": 0} for _ in range((last - first) // days + 1)]
    for record in records:
        for index in range((record["start"] // DAY_MS - first) // days, (last_time(record) // DAY_MS - first) // days + 1):
            bars[index]["files"] += 1
    return _labelled(bars, first, days), days


def chart(bars: list[dict], days: int, measure: str, unit: str, of: str = "record time") -> dict:
    """Bar geometry for an SVG chart of ``measure`` (drawn by the template in a 600 x 170 viewBox)."""
    top = max((bar[measure] for bar in bars), default=0) or 1
    slot = (PLOT_RIGHT - PLOT_LEFT) / max(1, len(bars))
    rects = []
    for index, bar in enumerate(bars):
        height = bar[measure] / top * PLOT_HEIGHT
        rects.append(
            {
                "x": round(PLOT_LEFT + index * slot + slot * 0.1, 2),
                "width": round(max(slot * 0.8, 0.5), 2),
                "y": round(PLOT_BOTTOM - height, 2),
                "height": round(height, 2),
                "day": bar["day"],
                "value": round(bar[measure]),
                "title": f"{bar['label']}: {round(bar[measure]):,} {unit.removesuffix('s') if round(bar[measure]) == 1 else unit}",
            }
        )
    per = "day" if days == 1 else f"{days} days"
    first, last = bars[0]["label"][:10], bars[-1]["label"][:10]
    return {"measure": measure, "unit": unit, "per": per, "of": of, "rects": rects, "top": top, "first": first, "last": last}


def commits_of(files: list[dict]) -> list[dict]:
    """Per commit, newest first: its files, records, bytes and record time span."""
    commits: dict[int, dict] = {}
    for entry in files:
        commit = commits.setdefault(entry["commit"], {"commit": entry["commit"], "files": 0, "records": 0, "bytes": 0})
        commit["files"] += 1
        commit["records"] += entry["records"]
        commit["bytes"] += entry["size"]
        commit["start"] = min(commit.get("start", entry["start"]), entry["start"])
        commit["end"] = max(commit.get("end", entry["end"]), entry["end"])
    return [commits[number] for number in sorted(commits, reverse=True)]


def last_commit_ms(lake: Lake, manifest_key: str, files: list[dict]) -> int | None:
    """When the manifest was last written (every commit writes it); else the newest file's creation."""
    for info in lake.storage.list(manifest_key):
        if info.key == manifest_key:
            return int(info.mtime * 1000)
    return max((file_id_ms(f["id"]) for f in files), default=None)


def stream_doc(lake: Lake, tap_id: str, stream: str, now: int) -> dict:
    """Everything a stream's page and index row show, from its manifest and listing; raises
    LookupError naming the problem when the manifest is missing or invalid (no scan: no data file is read)."""
    paths = lake.paths(tap_id, stream)
    manifest, problem = read_manifest(lake, paths)
    if problem:
        raise LookupError(f"{problem.detail} ({problem.path})")
    doc = describe_stream(lake, tap_id, stream, manifest)
    ordered = sorted(manifest.versions.values(), key=lambda v: int(v["version"][1:]))
    for index, version in enumerate(doc["versions"]):
        version["diff"] = schema_changes(ordered[index - 1], ordered[index]) if index else []
        version["key_properties"] = ordered[index]["key_properties"]
    latest = ordered[-1] if ordered else {"schema": {}, "key_properties": []}
    committed = last_commit_ms(lake, paths.manifest, manifest.files)
    bars, days = per_day(manifest.files)
    newest_first = sorted(manifest.files, key=lambda f: (f["commit"], f["id"]), reverse=True)
    return {
        **doc,
        "key_properties": latest["key_properties"],
        "schema_rows": schema_rows(latest["schema"]),
        "last_commit": iso_ms(committed) if committed is not None else None,
        "age": age_text(committed, now) if committed is not None else None,
        "charts": [chart(bars, days, "records", "records"), chart(bars, days, "bytes", "bytes")] if bars else [],
        "commit_rows": commits_of(manifest.files)[:MAX_ROWS],
        "file_rows": newest_first[:MAX_ROWS],
        "activate_versions": manifest.activate_versions,
        "replaced": len(manifest.replaced),
        "labels": {schema_hash: version["version"] for schema_hash, version in manifest.versions.items()},
        "tables": published_table(lake.storage, manifest),
    }


def what_doc(storage: Storage, what: str) -> dict:
    """Everything a what's page and index row show, from every committed segment of the what."""
    records = files_index.all_records(storage, what)
    wheres: dict[str, dict] = {}
    for record in records:
        where = wheres.setdefault(record["where"], {"where": record["where"], "files": 0, "bytes": 0, "start": record["start"], "end": 0})
        where["files"] += 1
        where["bytes"] += record["size"]
        where["start"] = min(where["start"], record["start"])
        where["end"] = max(where["end"], last_time(record))
    bars, days = files_per_day(records)
    created = [r["created"] for r in records if r.get("created")]
    return {
        "files": len(records),
        "bytes": sum(r["size"] for r in records),
        "wheres": [wheres[name] for name in sorted(wheres)],
        "start": min((r["start"] for r in records), default=None),
        "end": max((last_time(r) for r in records), default=None),
        "first_day": iso_ms(min(r["start"] for r in records))[:10] if records else None,
        "last_day": iso_ms(max(last_time(r) for r in records))[:10] if records else None,
        "pushes": len({r["txn"] for r in records}),
        "last_push": max(created, default=None),
        "charts": [chart(bars, days, "files", "files", of="the files' time (a file spanning days counts in each)")] if bars else [],
        "file_rows": sorted(records, key=newness, reverse=True)[:MAX_FILE_ROWS],
    }


def what_docs(storage: Storage) -> tuple[list[dict], list[WhatFailure]]:
    """Each what of pushed files (``files/index/<what>/``) for the site; one that cannot be read gets a
    page saying why, and a failure."""
    whats, problems = [], []
    for what in files_index.whats(storage):
        try:
            doc = {"problem": None, **what_doc(storage, what)}
        except Exception as exc:  # a damaged segment or record: that what's page says so, the others are built
            problems.append(WhatFailure(what, one_line(exc)))
            doc = {"problem": problems[-1].cause, "wheres": []}
        whats.append({**doc, "what": what, "page": what_page_name(what)})
    return whats, problems


def verify_by_stream(result: VerifyResult, streams: list[StreamId], lake: Lake) -> tuple[dict[StreamId, dict], list[Finding]]:
    """Each stream's findings (by the path they name) and failure; findings of no stream go to the index."""
    status: dict[StreamId, dict] = {sid: {"findings": [], "failure": None} for sid in streams}
    by_dir = {lake.paths(*sid).stream_dir: sid for sid in streams}  # raw/<tap>/<stream>
    lake_findings = []
    for finding in result.findings:
        owner = by_dir.get("/".join(finding.path.split("/")[:3])) if finding.path.count("/") >= 3 else None
        (status[owner]["findings"] if owner else lake_findings).append(finding)
    for failure in result.failures:
        status.setdefault((failure.tap_id, failure.stream), {"findings": [], "failure": None})["failure"] = failure.cause
    return status, lake_findings


# -- rendering -----------------------------------------------------------------------------------------
def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("singerlake.site", "templates"),
        autoescape=True,  # every template is HTML: names from the wild must stay text
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = lambda n: f"{round(n):,}"
    env.filters["size"] = human_bytes
    env.filters["when"] = when_html
    return env


def when_html(moment: str | int | None) -> Markup:
    """A ``<time>`` for an ISO timestamp or ms since the epoch (a filter, not a macro: pages call it
    thousands of times, and Jinja macros are slow)."""
    if moment is None:
        return Markup("–")
    text = iso_ms(moment) if isinstance(moment, int) else moment
    return Markup('<time datetime="{}">{}</time>').format(text, text[:19].replace("T", " "))


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def render(taps: list[dict], lake_findings: list[Finding] | None, root: str, now: int, whats: list[dict] | None = None) -> dict[str, bytes]:
    env = _environment()
    assets = resources.files("singerlake.site") / "templates"
    css = (assets / "site.css").read_text("utf-8")
    script = (assets / "search.js").read_text("utf-8")
    common = {
        "css": Markup(css),  # our own files, not data: inserted as they are
        "script": Markup(script),
        "csp": f"default-src 'none'; style-src {_csp_hash(css)}; script-src {_csp_hash(script)}; base-uri 'none'; form-action 'none'",
        "built": iso_ms(now),
        "root": root,
        "verified": lake_findings is not None,
    }
    pages = {}
    stream_template = env.get_template("stream.html")
    for tap in taps:
        for stream in tap["streams"]:
            html = stream_template.render(**common, tap=tap, s=stream, home="../")
            pages[stream["page"]] = html.encode("utf-8")
    what_template = env.get_template("what.html")
    for what in whats or []:
        pages[what["page"]] = what_template.render(**common, w=what, home="../").encode("utf-8")
    index = env.get_template("index.html").render(**common, taps=taps, whats=whats or [], lake_findings=lake_findings or [], home="")
    pages[INDEX] = index.encode("utf-8")
    return pages


def build_site(lake: Lake, verified: VerifyResult | None = None, now: int | None = None) -> Site:
    """The site's pages, read from the lake's metadata, and the index of its pushed files. A stream whose
    manifest is missing or invalid, or whose metadata cannot be read, gets a page saying so and is listed
    in ``problems``; so does a what whose index cannot be read. A lake of files alone has no taps."""
    now = now_ms() if now is None else now
    root = lake.root_metadata()
    tap_ids = sorted(set(root["taps"]) | set(lake.listed_taps()))
    stream_ids = [(tap, stream) for tap in tap_ids for stream in lake.listed_streams(tap)]
    failures = Failures()
    docs = for_each_stream(stream_ids, lambda tap, stream: stream_doc(lake, tap, stream, now), failures)
    problems: list[StreamFailure] = []
    failures.deliver(problems)
    cause = {(p.tap_id, p.stream): p.cause for p in problems}
    status, lake_findings = verify_by_stream(verified, stream_ids, lake) if verified else ({}, None)
    taps = []
    for tap_id in tap_ids:
        notes = root["taps"].get(tap_id)
        notes = notes if isinstance(notes, dict) else {}  # a tap only on storage, or a hand-edited entry
        streams = []
        for sid in (sid for sid in stream_ids if sid[0] == tap_id):
            stream = docs.get(sid, {"problem": cause.get(sid)})
            streams.append({"problem": None, **stream, "name": sid[1], "page": page_name(*sid), "verify": status.get(sid)})
        taps.append(
            {
                "tap_id": tap_id,
                "notes": {name: notes.get(name) for name in ("owner", "description")},
                "links": {label: (notes.get(key), safe_link(notes.get(key)), key) for label, key in LINKS},
                "streams": streams,
            }
        )
    whats, what_problems = what_docs(lake.storage)
    pages = render(taps, lake_findings, lake.storage.url, now, whats)
    return Site(pages, len(stream_ids), [*problems, *what_problems], len(whats))


# -- writing ---------------------------------------------------------------------------------------------
def write_site(site: Site, storage: Storage, prefix: str = "") -> None:
    """Stream and what pages first, the index last (it never links to a page not yet written), then
    delete the pages of streams and whats no longer in the lake. Pages are derived data: no fsync."""
    for name, html in site.pages.items():
        if name != INDEX:
            storage.write(prefix + name, html, durable=False, content_type=HTML)
    storage.write(prefix + INDEX, site.pages[INDEX], durable=False, content_type=HTML)
    for folder in (STREAM_PAGES, FILE_PAGES):
        try:
            old = [info.key for info in storage.list(prefix + folder)]
        except NotFound:
            continue
        for key in old:
            name = key[len(prefix) :]
            # only the pages themselves: never anything deeper (a site written into a lake root has files/ beside it)
            if name.endswith(".html") and "/" not in name[len(folder) :] and name not in site.pages:
                storage.delete(key)
