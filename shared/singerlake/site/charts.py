"""What the docs site's pages chart and tabulate (``site.pages``): records and bytes per day, pushed files per
day, commits, a schema's properties as rows, ages and sizes in words."""

from __future__ import annotations

import math

from singerlake.files.record import last_time
from singerlake.jobs.describe import type_text
from singerlake.times import iso_ms

DAY_MS = 86_400_000
MAX_BARS = 366  # a longer life is charted in bars of several days
MAX_SCHEMA_DEPTH = 8
PLOT_LEFT, PLOT_RIGHT, PLOT_BOTTOM, PLOT_HEIGHT = 64, 600, 140, 126  # chart area in the SVG's viewBox


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


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
