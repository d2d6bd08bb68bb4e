"""Spark's own account of the jobs some code ran: the code runs in a job group of its own, and Spark's status
tracker then gives that group's jobs and each job's tasks (once its listener bus has caught up). A test asserts
these, not what the code under test says it ran."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from support.cli_session import CliSession

TESTS = str(Path(__file__).resolve().parents[1])
BUS_TIMEOUT_MS = 60_000


@dataclass
class Jobs:
    group: str
    jobs: list[dict] = field(default_factory=list)  # per job, in id order: {"id", "status", "stages", "tasks"}

    @property
    def count(self) -> int:
        return len(self.jobs)

    @property
    def tasks(self) -> int:
        return sum(job["tasks"] for job in self.jobs)


def jobs_of_group(sc, group: str) -> list[dict]:
    """The jobs of ``group`` that Spark ran in ``sc``, from its status tracker."""
    sc._jsc.sc().listenerBus().waitUntilEmpty(BUS_TIMEOUT_MS)  # every job start and end posted so far is in the tracker
    tracker = sc.statusTracker()
    found = []
    for job_id in sorted(tracker.getJobIdsForGroup(group)):
        info = tracker.getJobInfo(job_id)
        stages = [tracker.getStageInfo(stage) for stage in info.stageIds]
        assert all(stages), f"job {job_id}: stage info dropped (spark.ui.retainedStages)"
        found.append({"id": job_id, "status": info.status, "stages": len(stages), "tasks": sum(stage.numTasks for stage in stages)})
    return found


def _set_group(sc, group: str | None) -> None:
    if group is None:  # as clearJobGroup, which pyspark lacks
        for key in ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel"):
            sc.setLocalProperty(key, None)
    else:
        sc.setJobGroup(group, "measured by a test")


@contextlib.contextmanager
def measured(spark) -> Iterator[Jobs]:
    """The jobs ``spark`` runs for the block: those started on this thread (and on the threads it starts)."""
    jobs = Jobs(f"measured-{uuid.uuid4().hex}")
    _set_group(spark.sparkContext, jobs.group)
    try:
        yield jobs
    finally:
        _set_group(spark.sparkContext, None)
    jobs.jobs = jobs_of_group(spark.sparkContext, jobs.group)


_START = """
import sys
from singerlake.spark.session import spark_session

spark_session(sys.argv[2]).sparkContext.setJobGroup(sys.argv[1], "measured by a test")
"""
_END = """
import json, sys
from pyspark import SparkContext

sys.path.insert(0, sys.argv[2])
from support.spark_jobs import _set_group, jobs_of_group

sc = SparkContext._active_spark_context
_set_group(sc, None)
print(json.dumps(jobs_of_group(sc, sys.argv[1])))
"""


@contextlib.contextmanager
def measured_in(session: CliSession, master: str) -> Iterator[Jobs]:
    """As ``measured``, for the commands run in ``session`` meanwhile: its Spark session (on ``master``) is started
    first (the commands find it, as they find one an earlier command started), and runs their jobs in the group."""
    jobs = Jobs(f"measured-{uuid.uuid4().hex}")
    started = session.python(_START, jobs.group, master)
    assert started.returncode == 0, started.stderr[-3000:]
    try:
        yield jobs
    finally:  # the group is cleared whatever happened: later commands of the session run outside it
        ended = session.python(_END, jobs.group, TESTS)
    assert ended.returncode == 0, ended.stderr[-3000:]
    jobs.jobs = json.loads(ended.stdout.strip().splitlines()[-1])
