"""A job's output on this machine reaches the log store through the real path: a local-driver
job's files, the worker's beat shipping them, the API searching them."""

import sys
import textwrap
import time

import pytest
from django.utils import timezone

from aistation.services.jobs import job_cancel, job_submit

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SCRIPT = textwrap.dedent("""
    import os, time
    rank = os.environ["RANK"]
    for step in range(1, 4):
        print(f"rank {rank} step {step} loss {3.0 / step:.2f}", flush=True)
    print(f"NCCL WARN marker from rank {rank}", flush=True)
    time.sleep(120)
""")


def test_a_two_replica_jobs_lines_are_searchable_within_seconds(
        api, world, local_queue, log_store, celery_worker_process):
    job = job_submit(actor=world.alpha_member, tenant=world.alpha, queue=local_queue,
                     name="printer", command=[sys.executable, "-c", SCRIPT], replicas=2)
    client = api.as_user(world.alpha_member)
    try:
        deadline = time.monotonic() + 90
        hits = []
        while time.monotonic() < deadline:
            hits = client.get("/api/v1/aistation/logs/",
                              {"q": '"NCCL WARN" marker', "job": job.pk}).json()["results"]
            if len(hits) == 2:
                break
            time.sleep(0.5)
        found_at = timezone.now()
        job.refresh_from_db()
        assert len(hits) == 2, f"job {job.state}: {job.reason}"
        # Printed right after it started: found within seconds, not at the job's end.
        started = job.attempts.get().started_at
        assert started is not None and (found_at - started).total_seconds() < 15
        assert {(h["attempt"], h["replica"], h["line"]) for h in hits} == {(1, 0, 4), (1, 1, 4)}
        assert {h["message"] for h in hits} == {"NCCL WARN marker from rank 0",
                                                "NCCL WARN marker from rank 1"}
        # Every line, in order, with its number in the replica's log.
        around = client.get("/api/v1/aistation/logs/around/",
                            {"job": job.pk, "replica": 1, "line": 2, "context": 5}).json()
        assert [line["message"] for line in around["lines"]] == [
            "rank 1 step 1 loss 3.00", "rank 1 step 2 loss 1.50", "rank 1 step 3 loss 1.00",
            "NCCL WARN marker from rank 1"]
        other = api.as_user(world.beta_member).get("/api/v1/aistation/logs/",
                                                   {"q": "marker"}).json()["results"]
        assert other == []
    finally:
        job.refresh_from_db()
        job_cancel(actor=world.alpha_member, job=job)
