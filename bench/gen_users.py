"""Generate the benchmark stream: `users`, N records of 9 fields, a STATE every 100k records.

1M records are about 290 MB of Singer text. Deterministic for a given seed.
With --spread-days N, each record also has `created_at`, a date-time spread evenly over N days of 2025
(for the partitioned tables' bench, bench/partitioned.py).
Usage: python bench/gen_users.py [RECORDS] [--spread-days N] > users.singer.jsonl
"""

from __future__ import annotations

import json
import random
import sys
from datetime import datetime, timedelta, timezone

SCHEMA = {
    "type": "SCHEMA",
    "stream": "users",
    "key_properties": ["id"],
    "schema": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "name": {"type": "string"},
            "email": {"type": "string", "format": "email"},
            "age": {"type": ["integer", "null"]},
            "score": {"type": "number"},
            "active": {"type": "boolean"},
            "updated_at": {"type": "string", "format": "date-time"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "address": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "zip": {"type": "string"},
                },
            },
        },
    },
}
FIRST = ["Ada", "Grace", "Linus", "Guido", "Zoë", "Ming", "Olamide", "Rajesh", "Søren", "Aiko"]
LAST = ["Lovelace", "Hopper", "Torvalds", "van Rossum", "Ångström", "Chen", "Adeyemi", "Kumar", "Kierkegaard"]
TAGS = ["admin", "beta", "churn-risk", "enterprise", "free", "newsletter", "trial", "vip"]
CITIES = ["London", "Lagos", "Tokyo", "São Paulo", "Montréal", "Berlin", "Pune", "Oslo"]


def messages(count: int, seed: int = 42, spread_days: int = 0):
    rng = random.Random(seed)
    start = datetime(2024, 1, 1, tzinfo=timezone.utc)
    schema = json.loads(json.dumps(SCHEMA))
    if spread_days:
        schema["schema"]["properties"]["created_at"] = {"type": "string", "format": "date-time"}
    yield json.dumps(schema)
    for i in range(1, count + 1):
        at = start + timedelta(milliseconds=i * 37)
        stamp = at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"
        first, last = rng.choice(FIRST), rng.choice(LAST)
        record = {
            "id": i,
            "name": f"{first} {last}",
            "email": f"{first.lower()}.{i}@example.com",
            "age": None if i % 7 == 0 else rng.randint(18, 90),
            "score": round(rng.random() * 1000, 3),
            "active": rng.random() < 0.8,
            "updated_at": stamp,
            "tags": rng.sample(TAGS, rng.randint(0, 3)),
            "address": {
                "city": rng.choice(CITIES),
                "zip": f"{rng.randint(10000, 99999)}",
            },
        }
        if spread_days:  # 7919 is prime to the seconds of the span: consecutive ids land on days far apart
            created = datetime(2025, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=i * 7919 % (spread_days * 86400))
            record["created_at"] = created.strftime("%Y-%m-%dT%H:%M:%SZ")
        message = {"type": "RECORD", "stream": "users", "record": record, "time_extracted": stamp}
        yield json.dumps(message, ensure_ascii=False, separators=(",", ":"))
        if i % 100_000 == 0 or i == count:
            yield json.dumps({"type": "STATE", "value": {"bookmarks": {"users": {"replication_key_value": stamp}}}})


def main() -> None:
    args = sys.argv[1:]
    spread_days = int(args[args.index("--spread-days") + 1]) if "--spread-days" in args else 0
    count = int(args[0]) if args and args[0] != "--spread-days" else 1_000_000
    out = sys.stdout
    for line in messages(count, spread_days=spread_days):
        out.write(line)
        out.write("\n")


if __name__ == "__main__":
    main()
