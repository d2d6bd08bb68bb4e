"""Generate the output of a database tap: STREAMS tables (`public.table_000`, ...) of RECORDS records each.

Each stream is a SCHEMA (key property `id`), its records in id order (6-9 fields, one of five table
kinds, each record with time_extracted), as a tap syncs one table after another; one STATE with
every stream's bookmark at the end. Deterministic. FIRST_ID > 1 gives a later incremental sync of
the same tables: new ids, later timestamps.
Usage: python bench/gen_streams.py STREAMS RECORDS [FIRST_ID] > streams.singer.jsonl
"""

from __future__ import annotations

import json
import random
import sys
from datetime import datetime, timedelta, timezone

STAMP = {"type": "string", "format": "date-time"}
NULLABLE = {"type": ["string", "null"]}
KINDS = {  # kind: properties besides `id` and `updated_at`
    "customers": {"name": {"type": "string"}, "email": {"type": "string"}, "country": {"type": "string"}, "is_active": {"type": "boolean"}},
    "orders": {
        "customer_id": {"type": "integer"},
        "status": {"type": "string"},
        "total": {"type": "number"},
        "currency": {"type": "string"},
        "ordered_at": STAMP,
        "note": NULLABLE,
    },
    "events": {"user_id": {"type": "integer"}, "event_type": {"type": "string"}, "properties": {"type": "object"}, "session_id": NULLABLE},
    "invoices": {
        "order_id": {"type": "integer"},
        "amount": {"type": "number"},
        "tax": {"type": "number"},
        "paid": {"type": "boolean"},
        "due_date": {"type": "string", "format": "date"},
        "issued_at": STAMP,
        "notes": NULLABLE,
    },
    "products": {
        "sku": {"type": "string"},
        "title": {"type": "string"},
        "price": {"type": "number"},
        "stock": {"type": ["integer", "null"]},
    },
}
KIND_NAMES = list(KINDS)
WORDS = ["alpha", "harbour", "Zoë", "Łódź", "quartz", "São Paulo", "ember", "北京", "delta", "Montréal"]
START = datetime(2024, 3, 1, tzinfo=timezone.utc)


def stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def fields(kind: str, i: int, at: str, rng: random.Random) -> dict:
    word = rng.choice(WORDS)
    if kind == "customers":
        return {"name": f"{word} {i}", "email": f"user{i}@example.com", "country": rng.choice(["GB", "NG", "JP"]), "is_active": i % 10 > 0}
    if kind == "orders":
        status, total = rng.choice(["new", "paid", "shipped"]), round(rng.random() * 500, 2)
        note = None if i % 3 else f"leave at {word}"
        return {"customer_id": rng.randint(1, 50_000), "status": status, "total": total, "currency": "EUR", "ordered_at": at, "note": note}
    if kind == "events":
        properties = {"page": f"/{word}", "ms": rng.randint(5, 900)}
        session = None if i % 5 == 0 else f"s{i:08x}"
        return {
            "user_id": rng.randint(1, 50_000),
            "event_type": rng.choice(["view", "click"]),
            "properties": properties,
            "session_id": session,
        }
    if kind == "invoices":
        amount, tax = round(rng.random() * 900, 2), round(rng.random() * 90, 2)
        return {"order_id": i * 3, "amount": amount, "tax": tax, "paid": i % 3 > 0, "due_date": at[:10], "issued_at": at, "notes": None}
    stock = None if i % 9 == 0 else rng.randint(0, 500)
    return {"sku": f"SKU-{i:06d}", "title": f"{word} {rng.randint(1, 99)}", "price": round(rng.random() * 80, 2), "stock": stock}


def messages(streams: int, records: int, first_id: int = 1):
    bookmarks = {}
    for number in range(streams):
        stream, kind = f"public.table_{number:03d}", KIND_NAMES[number % len(KINDS)]
        rng = random.Random(f"{stream}:{first_id}")
        schema = {"type": "object", "properties": {"id": {"type": "integer"}, **KINDS[kind], "updated_at": STAMP}}
        yield {"type": "SCHEMA", "stream": stream, "schema": schema, "key_properties": ["id"]}
        extracted = stamp(START + timedelta(minutes=first_id + records, seconds=number))  # just after its last record
        for i in range(first_id, first_id + records):
            at = stamp(START + timedelta(minutes=i, milliseconds=number))
            record = {"id": i, **fields(kind, i, at, rng), "updated_at": at}
            yield {"type": "RECORD", "stream": stream, "record": record, "time_extracted": extracted}
        bookmarks[stream] = {"replication_key": "updated_at", "replication_key_value": at}
    yield {"type": "STATE", "value": {"bookmarks": bookmarks}}


def main() -> None:
    streams, records = int(sys.argv[1]), int(sys.argv[2])
    first_id = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    for message in messages(streams, records, first_id):
        sys.stdout.write(json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
