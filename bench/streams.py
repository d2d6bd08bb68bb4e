"""Shapes of real taps for bench/run.py: many streams of few records, one tiny stream, a second
(incremental) run onto an existing lake, the lake jobs on it, and the cost of starting Spark alone.

Inputs come from bench/gen_streams.py, cached in bench/out. run.py lands them with its target
helpers; this module holds what is particular to the shapes.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from measure import Measurement, measure

HERE = Path(__file__).resolve().parent
if str(HERE.parent / "tests") not in sys.path:
    sys.path.insert(0, str(HERE.parent / "tests"))  # the tests' shared tools (tests/support): the same S3 server launcher
from support.s3_servers import start_moto  # noqa: E402

OUT = HERE / "out"
CLI = str(Path(sys.executable).parent / "singerlake")


@dataclass(frozen=True)
class Shape:
    key: str
    streams: int
    records: int  # per stream
    first_id: int = 1

    @property
    def total(self) -> int:
        return self.streams * self.records

    @property
    def label(self) -> str:
        run = ", second run" if self.first_id > 1 else ""
        return f"{self.streams:,} stream{'s' if self.streams > 1 else ''} × {self.records:,}{run}"


MANY = Shape("300x200", 300, 200)
SHAPES = {shape.key: shape for shape in [MANY, Shape("1000x20", 1000, 20), Shape("10", 1, 10)]}
SECOND = Shape("second", 300, 5, first_id=MANY.records + 1)  # 5 new records per stream onto MANY's lake
JOBS = ["verify", "compact", "project"]  # in this order, on the lake left by SECOND
BASELINE_LABEL = "Spark session start + one Python task"
BASELINE = """
from singerlake.spark.session import spark_session
spark = spark_session(master="local[*]")
assert spark.range(1).mapInArrow(lambda batches: batches, "id long").collect()[0].id == 0
"""


def singer_file(shape: Shape) -> Path:
    path = OUT / f"streams-{shape.streams}x{shape.records}-from{shape.first_id}.singer.jsonl"
    if not path.exists():
        OUT.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".tmp"), "wb") as handle:
            command = [sys.executable, str(HERE / "gen_streams.py"), str(shape.streams), str(shape.records), str(shape.first_id)]
            subprocess.run(command, stdout=handle, check=True)
        path.with_suffix(".tmp").rename(path)
    return path


def fresh_copy(source: Path, destination: Path) -> Path:
    shutil.rmtree(destination, ignore_errors=True)
    shutil.copytree(source, destination)
    return destination


def baseline(work: Path) -> Measurement:
    """Start Spark as the project does (singerlake.spark) and collect one row through a Python worker, in a new process."""
    return logged("baseline", [sys.executable, "-c", BASELINE], work)


def lake_jobs(lake: Path, work: Path) -> list[Measurement]:
    """`singerlake verify`, `compact`, `project` (Spark local[*]) in turn on a fresh copy of ``lake``."""
    root = str(fresh_copy(lake, work / "jobs-lake"))
    return [logged(f"singerlake {job}", [CLI, job, root, "--json"], work) for job in JOBS]


def logged(name: str, command: list[str], work: Path) -> Measurement:
    """Measure ``command`` with its stderr kept, to show when it fails (verify: 1 = the lake has problems)."""
    log = work / f"{name.replace(' ', '-')}.log"
    with open(log, "wb") as stderr:
        result = measure(command, None, stderr=stderr)
    if result.returncode != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-40:])
        raise SystemExit(f"{tail}\n{name} failed with exit code {result.returncode} (stderr above)")
    return result


@contextlib.contextmanager
def moto_s3() -> Iterator[dict]:
    """The tests' moto S3 server (tests/support/s3_servers.py: moto with each write applied atomically, as S3
    applies a conditional write) on 127.0.0.1, with a fresh bucket; yields target settings for a lake in it."""
    with tempfile.TemporaryDirectory(prefix="bench-moto-") as work:
        server = start_moto(Path(work))
        try:
            settings = {
                "s3_endpoint_url": server.endpoint,
                "s3_access_key_id": "bench",
                "s3_secret_access_key": "bench-secret",
                "s3_region": "us-east-1",
            }
            bucket = f"bench-{uuid.uuid4().hex[:8]}"
            import boto3

            keys = {"aws_access_key_id": "bench", "aws_secret_access_key": "bench-secret", "region_name": "us-east-1"}
            boto3.client("s3", endpoint_url=settings["s3_endpoint_url"], **keys).create_bucket(Bucket=bucket)
            yield {"lake_root": f"s3://{bucket}/lake", **settings}
        finally:
            server.stop()
