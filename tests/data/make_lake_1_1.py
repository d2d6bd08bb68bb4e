"""How lake-1.1/ was written: run with the 1.x code (git show <1.1 commit>:shared) on the PYTHONPATH."""
# ruff: noqa  (a frozen script, run once against the 1.1 code)

import json
import shutil
import sys
from pathlib import Path

from singerlake.jobs.compact import merge_group, merged_runs, plan_groups, swap_in
from singerlake.lake import Lake
from singerlake.format.manifest import SPEC_VERSION
from singerlake.landing.writer import SchemaWriter

assert SPEC_VERSION.startswith("1."), SPEC_VERSION
out = Path(sys.argv[1])
shutil.rmtree(out, ignore_errors=True)
lake = Lake.open(str(out))
schema = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}}
n = 0
for stream in ("users", "public.orders"):
    with SchemaWriter(
        lake, "tap-old", {"type": "SCHEMA", "stream": stream, "schema": schema, "key_properties": ["id"]}, work_id="old"
    ) as w:
        for commit in range(6):
            files = []
            for f in range(2):
                lines = [
                    json.dumps({"type": "RECORD", "stream": stream, "record": {"id": n + i, "name": f"r{n + i}"}}).encode()
                    for i in range(3)
                ]
                files.append(w.write_file(lines, [1700000000000 + (n + i) * 60000 for i in range(3)]))
                n += 3
            w.commit(files)
            if commit == 2:
                lake.update_manifest(
                    w.paths,
                    lambda m: m.activate_versions.append(
                        {"version": 1700000000000 + commit, "after_commit": m.commits, "received": "2023-11-14T22:13:20.000Z"}
                    ),
                )
                w.manifest = None
manifest = lake.manifest("tap-old", "users")
groups = plan_groups(manifest, 1 << 20)[:1]
items = [
    {
        "tap_id": "tap-old",
        "stream": "users",
        "schema_hash": g[0][0]["schema_hash"],
        "files": [e for e, _ in g][:4],
        "runs": merged_runs(g[:4]),
        "work_id": "compact-old",
    }
    for g in groups
]
done = [(item, merge_group(lake.storage, 6, item)) for item in items]
swap_in(lake, "tap-old", "users", done)
print(json.dumps({s: len(lake.manifest("tap-old", s).files) for s in ("users", "public.orders")}))
