"""The README's main job: the sample Meltano pipeline both ways, on the default set-up (a local lake in the
project, Spark local[*]), in a fresh copy of this Meltano project (see meltano_project.py: no install, no network).

  meltano run tap-jsonl target-singerlake singerlake:project
                                            lands demo/jsonl/*.jsonl in <project>/singerlake as tap id tap-jsonl,
                                            then keeps each stream's current rows as a Delta table (published/)
  meltano run tap-singerlake target-jsonl   replays the lake into <project>/output/users.jsonl

then checks that the replayed records are the sample's and prints a summary.

Usage: python demo/meltano_demo.py [PROJECT_DIR]   (default demo/out; a previous demo there is replaced)
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

from meltano_project import BIN, REPO, SAMPLE, create, meltano, read_jsonl, without_sdc

MARK = ".singerlake-demo"  # only a directory holding this is ever deleted


def fresh_project(project: Path) -> Path:
    if project.exists():
        if not (project / MARK).exists():
            raise SystemExit(f"{project} exists and is not a previous demo; give another PROJECT_DIR")
        shutil.rmtree(project)
    create(project)
    (project / MARK).touch()
    return project


def landed_records(lake: Path) -> int:
    """RECORD lines in the lake's data files (raw/<tap_id>/<stream>/<schema hash>/*.singer.gz)."""
    count = 0
    for path in lake.glob("raw/*/*/*/*.singer.gz"):
        with gzip.open(path) as lines:
            count += sum(1 for line in lines if json.loads(line)["type"] == "RECORD")
    return count


def main() -> None:
    project = fresh_project(Path(sys.argv[1] if len(sys.argv) > 1 else REPO / "demo" / "out").absolute())
    lake, output = project / "singerlake", project / "output" / "users.jsonl"
    files = sorted(SAMPLE.glob("*.jsonl"))
    sample = read_jsonl(*files)
    print(f"Meltano project {project}: ./meltano.yml without pip_url (plugins from {BIN}), offline")

    meltano(project, "run", "tap-jsonl", "target-singerlake", "singerlake:project")
    print(f"1. meltano run tap-jsonl target-singerlake singerlake:project: {len(sample)} records of {len(files)} files in demo/jsonl")
    print(f"   landed as {landed_records(lake)} records in {lake} (raw/tap-jsonl/users, Spark local[*])")
    print(f"   current rows as a Delta table in {lake / 'published' / 'tap-jsonl' / 'users'}")

    meltano(project, "run", "tap-singerlake", "target-jsonl")
    replayed = read_jsonl(output)
    same = without_sdc(replayed) == sample
    print(f"2. meltano run tap-singerlake target-jsonl: {len(replayed)} records replayed into {output}")
    print(f"   equal to the sample, in order (tap-jsonl's _sdc_ columns aside): {same}")

    state = json.loads(meltano(project, "state", "get", "dev:tap-singerlake-to-target-jsonl").stdout)["singer_state"]
    print(f"   Meltano saved tap-singerlake's bookmark {json.dumps(state)}: a rerun replays only what lands after it")
    print(subprocess.run([str(BIN / "singerlake"), "ls", str(lake)], capture_output=True, text=True, check=True).stdout)
    if not same:
        raise SystemExit("the replayed records differ from the sample")


if __name__ == "__main__":
    main()
