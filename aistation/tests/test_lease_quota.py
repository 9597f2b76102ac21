"""Servers leased to a tenant count against its GPU quota for jobs too."""

from datetime import timedelta

from django.utils import timezone

from aistation.choices import JobState
from aistation.services.scheduling import load_snapshot
from infra_os.choices import ServerState
from infra_os.models import Server
from infra_os.services.leases import lease_create, lease_end


def _lease_8_gpus(world):
    server = Server.objects.create(name="bm-01", state=ServerState.PROVISIONED,
                                   expected_gpu_model="H100", expected_gpu_count=8)
    now = timezone.now()
    return lease_create(actor=world.operator, server=server, tenant=world.alpha, starts_at=now,
                        ends_at=now + timedelta(days=1))


def test_the_snapshot_takes_leased_gpus_off_the_quota(farm, world):
    later = _lease_8_gpus(world).ends_at
    snapshot, _rows = load_snapshot(farm.cluster, timezone.now())
    quotas = {tenant.name: tenant.gpu_quota for tenant in snapshot.tenants}
    assert quotas == {"alpha": 0, "beta": 8}
    snapshot, _rows = load_snapshot(farm.cluster, later)  # the lease is over by then
    assert {tenant.name: tenant.gpu_quota for tenant in snapshot.tenants}["alpha"] == 8


def test_a_tenant_whose_quota_is_leased_waits_until_the_lease_ends(farm, world):
    lease = _lease_8_gpus(world)
    # Beta fills the cluster: 8 GPUs of its own and 8 borrowed.
    beta_jobs = [farm.submit("beta", gpus=8), farm.submit("beta", gpus=8)]
    farm.cycle()
    for job in beta_jobs:
        job.refresh_from_db()
    assert [job.state for job in beta_jobs] == [JobState.RUNNING] * 2
    assert sorted(job.borrowed for job in beta_jobs) == [False, True]

    job = farm.submit("alpha", gpus=8)
    farm.cycle()
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    # Its 8-GPU quota is held by the lease: the job may only borrow, and nothing is idle.
    assert job.reason.startswith("waiting: exceeds the tenant's quota of 0 GPUs")
    assert "no idle capacity to borrow" in job.reason

    lease_end(actor=world.operator, lease=lease)
    farm.cycle()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and not job.borrowed
    # Within its quota again, it takes back the capacity beta borrowed.
    lender = next(job for job in beta_jobs if job.borrowed)
    assert "reclaimed" in lender.events.get(to_state=JobState.PREEMPTED).reason
