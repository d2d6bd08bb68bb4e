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
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from urllib.parse import urlparse

import jinja2
from markupsafe import Markup

from singerlake.changes.view import VIEW_DIR, Entry, View, Visit, to_visit, updated, view_key, write_view
from singerlake.errors import one_line
from singerlake.files import index as files_index
from singerlake.files.record import last_time, newness
from singerlake.format.names import encode_segment
from singerlake.jobs.describe import describe_stream, schema_changes
from singerlake.jobs.verify import Finding, read_manifest
from singerlake.lake import Lake
from singerlake.site.charts import age_text, chart, commits_of, files_per_day, human_bytes, per_day, schema_rows
from singerlake.spark.runner import Failures, StreamFailure, StreamId, for_each_stream
from singerlake.storage import NotFound, Storage
from singerlake.tables.columns import published_table
from singerlake.tables.heads import Heads, read_heads
from singerlake.times import file_id_ms, iso_ms, now_ms

SITE_PREFIX = "docs/"  # where --publish puts the site under the lake root
INDEX = "index.html"
STREAM_PAGES = "streams/"
FILE_PAGES = "files/"  # a page per what of pushed files (SPEC.md §14)
HTML = "text/html; charset=utf-8"
MAX_ROWS = 200  # newest files and commits listed on a stream page
MAX_FILE_ROWS = 50  # latest files listed on a what's page
LINKS = (("docs", "docs_url"), ("logs", "logs_url"))  # annotations shown as links (the target's settings of those names)


ViewOf = Callable[[str], View | None]  # a tap's view as the site kept it (None: none that can be trusted)


@dataclass
class Site:
    pages: dict[str, bytes]  # relative name -> HTML written this run, stream and what pages first, the index last
    streams: int
    problems: list[StreamFailure | WhatFailure] = field(default_factory=list)
    whats: int = 0
    views: dict[str, View] = field(default_factory=dict)  # per tap, to keep beside the site
    read: int = 0  # streams read this run (their pages written)
    names: set[str] = field(default_factory=set)  # every page of the site, written this run or before
    walked: bool = True  # some tap had every stream read: pages of streams no longer in the lake are looked for
    known: dict[str, View | None] = field(default_factory=dict)  # the views the run started from


@dataclass
class TapPlan:
    """A tap's part of a run: its view and heads as read, what the change log says to visit, the streams
    of the site (``streams``) and those read this run (``read``)."""

    view: View | None
    visit: Visit
    heads: Heads
    streams: list[str]
    read: set[str]


def plan_tap(lake: Lake, tap_id: str, view: View | None, options: str) -> TapPlan:
    """Every stream dir listed without a view (or when the change log says to visit all); else the view's streams and those named."""
    heads = read_heads(lake.storage, tap_id)  # before the streams: a table that moves meanwhile is read again next run
    visit = to_visit(lake.storage, tap_id, view, heads.tables if heads.read else None, options)
    if view is None or visit.streams is None:
        streams = lake.listed_streams(tap_id)
        return TapPlan(view, visit, heads, streams, set(streams))
    return TapPlan(view, visit, heads, sorted(set(view.streams) | visit.streams), visit.streams)


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


def last_commit_ms(lake: Lake, manifest_key: str, files: list[dict]) -> int | None:
    """When the manifest was last written (every commit writes it); else the newest file's creation."""
    for info in lake.storage.list(manifest_key):
        if info.key == manifest_key:
            return int(info.mtime * 1000)
    return max((file_id_ms(f["id"]) for f in files), default=None)


def stream_doc(lake: Lake, tap_id: str, stream: str) -> dict:
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
        "last_commit_ms": committed,
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
            if stream["full"] is not None:  # read this run: the other streams' pages stay as they are
                html = stream_template.render(**common, tap=tap, s=stream["full"], home="../")
                pages[stream["page"]] = html.encode("utf-8")
    what_template = env.get_template("what.html")
    for what in whats or []:
        pages[what["page"]] = what_template.render(**common, w=what, home="../").encode("utf-8")
    index = env.get_template("index.html").render(**common, taps=taps, whats=whats or [], lake_findings=lake_findings or [], home="")
    pages[INDEX] = index.encode("utf-8")
    return pages


def index_row(doc: dict) -> dict:
    """What the index shows of a stream (kept in the site's view, so an unchanged stream is not read again):
    its numbers and times, and its table's version, Iceberg twin and JSON-text columns."""
    if doc.get("problem"):
        return {"problem": doc["problem"]}
    row = {key: doc[key] for key in ("records", "files", "bytes", "start", "end", "last_commit", "last_commit_ms")}
    table = None
    if tables := doc["tables"]:
        json_text = sum(1 for column in tables["columns"] if column["json_text"])
        table = {"version": tables["version"], "iceberg": "iceberg" in tables, "json_text": json_text}
    return {"problem": None, **row, "version_count": len(doc["versions"]), "table": table}


def tap_streams(tap_id: str, plan: TapPlan, docs: dict, cause: dict, status: dict, now: int) -> tuple[list[dict], dict[str, Entry]]:
    """A tap's streams as the index shows them, each with its whole doc (``full``) when it was read this run
    (its page is written), else None; and the view's entries of the streams read."""
    streams, computed = [], {}
    for name in plan.streams:
        sid = (tap_id, name)
        full = None
        if name in plan.read:
            full = {"problem": None, **docs.get(sid, {"problem": cause.get(sid)}), "name": name, "page": page_name(*sid)}
            full["verify"] = status.get(sid)
            computed[name] = Entry(index_row(full), plan.heads.get(name), failed=sid in cause)
        row = computed[name].doc if name in computed else plan.view.streams[name].doc
        age = age_text(row["last_commit_ms"], now) if row.get("last_commit_ms") is not None else None  # the index is rewritten each run
        streams.append({**row, "name": name, "page": page_name(*sid), "verify": status.get(sid), "age": age, "full": full})
    return streams, computed


def build_site(lake: Lake, verified: VerifyResult | None = None, now: int | None = None, view_of: ViewOf | None = None) -> Site:
    """The site's pages, read from the lake's metadata, and the index of its pushed files. A stream whose
    manifest is missing or invalid, or whose metadata cannot be read, gets a page saying so and is listed
    in ``problems``; so does a what whose index cannot be read. A lake of files alone has no taps.

    ``view_of(tap)`` gives the tap's view as the site kept it: then only the streams to visit (SPEC.md §16)
    are read and get their pages written, the index showing the others as the view has them; the run's
    views are in ``Site.views``. With ``verified``, every stream is read (and the next run reads every
    stream again, to drop the findings from the pages)."""
    now = now_ms() if now is None else now
    root = lake.root_metadata()
    tap_ids = sorted(set(root["taps"]) | set(lake.listed_taps()))
    known = {tap: None if verified or view_of is None else view_of(tap) for tap in tap_ids}
    plans = {tap: plan_tap(lake, tap, known[tap], "verify" if verified else "") for tap in tap_ids}
    to_read = [(tap, stream) for tap, plan in plans.items() for stream in plan.read]
    failures = Failures()
    docs = for_each_stream(to_read, lambda tap, stream: stream_doc(lake, tap, stream), failures)
    problems: list[StreamFailure] = []
    failures.deliver(problems)
    cause = {(p.tap_id, p.stream): p.cause for p in problems}
    stream_ids = [(tap, stream) for tap, plan in plans.items() for stream in plan.streams]
    status, lake_findings = verify_by_stream(verified, stream_ids, lake) if verified else ({}, None)
    taps, views = [], {}
    for tap_id, plan in plans.items():
        notes = root["taps"].get(tap_id)
        notes = notes if isinstance(notes, dict) else {}  # a tap only on storage, or a hand-edited entry
        streams, computed = tap_streams(tap_id, plan, docs, cause, status, now)
        views[tap_id] = updated(plan.view, plan.visit, computed)
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
    site = Site(pages, len(stream_ids), [*problems, *what_problems], len(whats), views, len(to_read))
    site.names = {INDEX, *(what["page"] for what in whats), *(page_name(*sid) for sid in stream_ids)}
    site.walked = any(plan.visit.streams is None for plan in plans.values())
    site.known = known
    return site


# -- writing ---------------------------------------------------------------------------------------------
def write_site(site: Site, storage: Storage, prefix: str = "", lake_url: str = "") -> None:
    """Stream and what pages first, the index last (it never links to a page not yet written), then
    delete the pages of streams and whats no longer in the lake (stream pages only when a tap's every
    stream was read: an incremental run knows its streams are all still there), then keep the views (with
    ``lake_url``, the lake's; last, so a run that stopped before is done again). Derived data: no fsync."""
    for name, html in site.pages.items():
        if name != INDEX:
            storage.write(prefix + name, html, durable=False, content_type=HTML)
    storage.write(prefix + INDEX, site.pages[INDEX], durable=False, content_type=HTML)
    folders = (STREAM_PAGES, FILE_PAGES, VIEW_DIR) if site.walked or not site.views else (FILE_PAGES,)
    kept = {view_key("", tap) for tap in site.views}
    for folder in folders:
        try:
            old = [info.key for info in storage.list(prefix + folder)]
        except NotFound:
            continue
        for key in old:
            name = key[len(prefix) :]
            # only the pages themselves: never anything deeper (a site written into a lake root has files/ beside it)
            flat = "/" not in name[len(folder) :]
            if flat and (name.endswith(".html") and name not in site.names or folder == VIEW_DIR and name not in kept):
                storage.delete(key)
    if lake_url:
        for tap, view in site.views.items():
            if view != site.known.get(tap):
                write_view(storage, prefix + view_key("", tap), view, "docs", lake_url, tap)
