"""Jobs on a real Slurm through the platform: a tenant's queue on a registered Slurm cluster,
a real Celery worker scheduling, launching and reconciling, and the platform's cordons
followed by Slurm's own drain."""

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import httpx
import openai
import pytest
from django.conf import settings as django_settings
from django.core.exceptions import ValidationError
from django.test import Client
from django.utils import timezone

from aistation.choices import FINAL_STATES, JobState
from aistation.services.jobs import job_cancel, job_submit
from aistation.services.notebooks import notebook_start, notebook_state, notebook_stop
from aistation.services.queues import queue_create
from aistation.services.workloads import tenant_uid
from infra_os.models import UsageRecord
from infra_os.services.tokens import api_token_create
from mmodel.models import DeploymentReplica, EvaluationResult
from mmodel.services.deployments import deployment_create, deployment_stop
from mmodel.services.evaluation import benchmark_create, evaluation_start
from mmodel.tests.evaluation_fixtures import MC_DOCS, _version, jsonl
from mmodel.tests.tiny import tiny_model
from podsys.choices import CheckState
from podsys.health.registry import health_checks
from podsys.models import Cluster, HealthCheckRun, Node
from podsys.services.clusters import (
    cluster_check_connection,
    cluster_create,
    cluster_sync_nodes,
    node_set_schedulable,
)
from tests.platform_server import platform_server
from tests.slurm_cluster import SlurmCluster, posix_accounts, shared_folder
from ylink import storage
from ylink.services.pipelines import pipeline_run_start
from ylink.services.training import training_run_start
from ylink.tests.corpus import demo_steps, uploaded_corpus

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def slurm():
    with SlurmCluster.temporary() as cluster:
        yield cluster


@pytest.fixture
def shared():
    with shared_folder() as folder:
        yield folder


@pytest.fixture
def hpc(world, slurm, shared):
    slurm.reset()
    cluster = cluster_create(actor=world.operator, name="hpc", driver="slurm", options={
        "slurm_conf": str(slurm.conf), "shared_dir": str(shared), "grace_s": 10})
    cluster_sync_nodes(cluster=cluster)
    with posix_accounts(tenant_uid(world.alpha.pk)):
        yield cluster


def _wait(job, condition, timeout=90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job.refresh_from_db()
        if condition(job):
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job.pk} stuck in {job.state}: {job.reason}")


ALL_REDUCE = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    tensor = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(tensor)
    print(f"rank {dist.get_rank()} on {os.environ['SLURMD_NODENAME']} sum {tensor.item()}",
          flush=True)
    dist.destroy_process_group()
""")


def test_registration_refuses_options_it_cannot_use_in_plain_words(world, slurm):
    with pytest.raises(ValidationError) as refused:
        cluster_create(actor=world.operator, name="hpc2", driver="slurm",
                       options={"slurm_conf": "/nowhere/slurm.conf"})
    assert "is not a file here" in str(refused.value)
    with pytest.raises(ValidationError, match="Unknown slurm option kubeconfig"):
        cluster_create(actor=world.operator, name="hpc2", driver="slurm",
                       options={"kubeconfig": "x"})
    with pytest.raises(ValidationError, match="shared_dir must be an absolute path"):
        cluster_create(actor=world.operator, name="hpc2", driver="slurm",
                       options={"shared_dir": "relative"})
    assert not Cluster.objects.filter(name="hpc2").exists()


def test_the_connection_check_speaks_plainly(world, hpc):
    report = cluster_check_connection(actor=world.operator, cluster=hpc)
    assert report.ok
    assert "2 nodes, 4 GPUs, partitions batch; accounting on" in report.message
    assert {node.name: node.gpus for node in hpc.nodes.all()} == {"n1": 2, "n2": 2}


# Stands in for the stack playbook, whose roles install packages: the nodes here already run
# slurmd against the test controller. Run by ansible-runner like the real one.
STACK_STAND_IN = """
- name: The Slurm stack (already on these nodes)
  hosts: all
  gather_facts: false
  tasks:
    - name: Slurm is there (the test started it)
      ansible.builtin.command: "true"
      changed_when: false
"""


def test_a_slurm_stack_deployment_moves_its_cluster_onto_slurm(
        world, slurm, shared, settings, tmp_path, monkeypatch):
    from podsys.services import deployments
    from podsys.services.demo import DEMO_PROFILES
    from podsys.services.deployments import deployment_start
    from podsys.services.stack import stack_profile_create
    from podsys.tasks.deployments import deploy_run
    from tests.factories import JobFactory

    slurm.reset()
    profile = stack_profile_create(actor=world.operator, **next(
        p for p in DEMO_PROFILES if p["orchestrator"] == "slurm"))
    farm = cluster_create(actor=world.operator, name="farm", driver="fake",
                          options={"nodes": 0})
    for name in slurm.node_names:
        Node.objects.create(cluster=farm, name=name, address="127.0.0.1")
    queue = queue_create(actor=world.operator, tenant=world.alpha, name="farm", cluster=farm)
    plays = tmp_path / "plays"
    plays.mkdir()
    (plays / "stack.yml").write_text(STACK_STAND_IN)
    monkeypatch.setattr(deployments, "PLAYBOOKS_DIR", plays)

    def deploy():
        run = deployment_start(actor=world.operator, cluster=farm, kind="stack",
                               hosts=slurm.node_names, profile=profile,
                               extra_vars={"stack_slurm_conf_server": "127.0.0.1"})
        assert deploy_run(run.pk) == "succeeded"
        run.refresh_from_db()
        farm.refresh_from_db()
        return run.message

    settings.OGAI_SLURM_CONF = ""
    assert deploy() == ("Slurm is on 2 nodes, but cluster farm still runs its jobs through the "
                        "fake driver: set OGAI_SLURM_CONF to the controller's slurm.conf on the "
                        "OGAI host and deploy again.")
    settings.OGAI_SLURM_CONF, settings.OGAI_SLURM_SHARED_DIR = str(slurm.conf), str(shared)
    placed = JobFactory(queue=queue, state="running", placement=["n1"], gpus_per_replica=1)
    assert deploy() == ("Slurm is deployed, but cluster farm stays on fake while jobs run on "
                        "n1: deploy again once they end.")
    assert farm.driver == "fake"
    placed.state = "succeeded"
    placed.save()
    message = deploy()
    assert message.startswith("Cluster farm now runs its jobs through Slurm. Slurm 22.05")
    assert "2 nodes, 4 GPUs" in message
    assert (farm.driver, farm.options) == ("slurm", {"slurm_conf": str(slurm.conf),
                                                     "shared_dir": str(shared)})
    # The same machines, once each, now as Slurm reports them; the queue stays on the cluster.
    assert {node.name: node.gpus for node in Node.objects.filter(name__in=slurm.node_names)} \
        == {"n1": 2, "n2": 2}
    assert Node.objects.filter(cluster=farm).count() == 2
    queue.refresh_from_db()
    assert queue.cluster == farm and cluster_check_connection(actor=world.operator,
                                                              cluster=farm).ok
    assert deploy() == "Cluster farm runs its jobs through Slurm: 2 nodes synced."


def test_a_two_node_torch_job_runs_as_the_tenant_with_its_ranks_logs_on_the_job_page(
        api, world, hpc, slurm, celery_worker_process):
    queue = queue_create(actor=world.operator, tenant=world.alpha, name="default", cluster=hpc)
    job = job_submit(actor=world.alpha_member, tenant=world.alpha, queue=queue, name="ddp",
                     command=[sys.executable, "-c", ALL_REDUCE], replicas=2,
                     gpus_per_replica=2, memory_mib_per_replica=512)
    job = _wait(job, lambda j: j.state in FINAL_STATES)
    client = api.as_user(world.alpha_member)
    texts = [client.get(f"/api/v1/aistation/jobs/{job.pk}/logs/?replica={rank}").json()["text"]
             for rank in (0, 1)]
    assert job.state == JobState.SUCCEEDED, (job.reason, texts)
    attempt = job.attempts.get()
    assert sorted(attempt.placement) == ["n1", "n2"]  # 2 GPUs each: one rank per node
    assert "rank 0 on" in texts[0] and "sum 3.0" in texts[0]
    assert "rank 1 on" in texts[1] and "sum 3.0" in texts[1]
    # Slurm ran it as the tenant's account, under the workload's name.
    ran = [j for j in json.loads(slurm.run("squeue", "--json").stdout)["jobs"]
           if j["name"] == attempt.workload_id]
    assert [j["user_id"] for j in ran] == [tenant_uid(world.alpha.pk)]
    # Billed as Slurm accounts it: sacct's elapsed time times the GPUs it allocated.
    [record] = json.loads(slurm.run("sacct", "--json", "--jobs", str(ran[0]["job_id"]),
                                    "--starttime", "1970-01-01T00:00:00").stdout)["jobs"]
    gpus = sum(t["count"] for t in record["tres"]["allocated"] if t["name"] == "gpu")
    assert gpus == 4
    usage = UsageRecord.objects.get(source=f"job {job.pk} attempt 1")
    assert usage.gpus == 4
    assert usage.gpu_seconds == record["time"]["elapsed"] * gpus
    assert usage.started_at.timestamp() == record["time"]["start"]


RESUMES = textwrap.dedent("""
    import os, pathlib, time
    step = pathlib.Path(os.environ["OGAI_CHECKPOINT_DIR"], "step")
    node = os.environ["SLURMD_NODENAME"]
    if step.exists():
        print(f"attempt {os.environ['OGAI_ATTEMPT']} on {node} resumed from {step.read_text()}")
    else:
        step.write_text("5")
        print(f"attempt {os.environ['OGAI_ATTEMPT']} on {node} saved step 5", flush=True)
        time.sleep(600)
""")


def test_a_node_lost_mid_job_retries_on_the_other_node_from_the_checkpoint(
        api, world, hpc, slurm, celery_worker_process):
    queue = queue_create(actor=world.operator, tenant=world.alpha, name="default", cluster=hpc)
    job = job_submit(actor=world.alpha_member, tenant=world.alpha, queue=queue, name="resume",
                     command=[sys.executable, "-c", RESUMES], gpus_per_replica=1,
                     memory_mib_per_replica=256, max_restarts=1)
    client = api.as_user(world.alpha_member)

    def logs():
        return client.get(f"/api/v1/aistation/jobs/{job.pk}/logs/").json()["text"]

    job = _wait(job, lambda j: j.state == JobState.RUNNING)
    deadline = time.monotonic() + 60
    while "saved step 5" not in logs() and time.monotonic() < deadline:
        time.sleep(0.3)
    first = job.attempts.get().placement[0]
    slurm.lose_node(first, reason="lost in test")
    try:
        job = _wait(job, lambda j: j.state in FINAL_STATES, timeout=120)
        assert job.state == JobState.SUCCEEDED, job.reason
        second = job.attempts.order_by("number").last()
        assert second.number == 2 and second.placement[0] != first
        assert f"attempt 2 on {second.placement[0]} resumed from 5" in logs()
    finally:
        slurm.restore_node(first)


def test_cancel_gives_the_job_its_grace_to_checkpoint_and_bills_what_sacct_says_ran(
        world, hpc, slurm, celery_worker_process):
    queue = queue_create(actor=world.operator, tenant=world.alpha, name="default", cluster=hpc)
    job = job_submit(actor=world.alpha_member, tenant=world.alpha, queue=queue, name="grace",
                     command=[sys.executable, "-c", textwrap.dedent("""
                         import os, pathlib, signal, sys, time
                         def save(signum, frame):
                             pathlib.Path(os.environ["OGAI_CHECKPOINT_DIR"], "saved").touch()
                             sys.exit(0)
                         signal.signal(signal.SIGTERM, save)
                         print("training", flush=True)
                         time.sleep(600)
                     """)], gpus_per_replica=1, memory_mib_per_replica=256)
    job = _wait(job, lambda j: j.state == JobState.RUNNING)
    workload = job.attempts.get().workload_id
    folder = Path(hpc.options["shared_dir"], "workloads", workload)
    deadline = time.monotonic() + 60
    while not (folder / "replica-0.log").exists() and time.monotonic() < deadline:
        time.sleep(0.3)
    time.sleep(1)
    job_cancel(actor=world.alpha_member, job=job)
    job = _wait(job, lambda j: j.state in FINAL_STATES)
    assert job.state == JobState.CANCELLED
    saved = list(Path(hpc.options["shared_dir"], "data").glob("jobs/*/checkpoints/saved"))
    deadline = time.monotonic() + 30
    while not saved and time.monotonic() < deadline:
        time.sleep(0.3)
        saved = list(Path(hpc.options["shared_dir"], "data").glob("jobs/*/checkpoints/saved"))
    assert len(saved) == 1
    # Stopped by the platform, billed as Slurm accounts it all the same.
    deadline = time.monotonic() + 30
    while not UsageRecord.objects.filter(source=f"job {job.pk} attempt 1").exists() \
            and time.monotonic() < deadline:
        time.sleep(0.3)
    usage = UsageRecord.objects.get(source=f"job {job.pk} attempt 1")
    [ran] = [j for j in json.loads(slurm.run("squeue", "--json").stdout)["jobs"]
             if j["name"] == workload]
    [record] = json.loads(slurm.run("sacct", "--json", "--jobs", str(ran["job_id"]),
                                    "--starttime", "1970-01-01T00:00:00").stdout)["jobs"]
    assert usage.gpus == 1 and usage.gpu_seconds == record["time"]["elapsed"]
    assert usage.ended_at.timestamp() == record["time"]["end"]


def test_the_scheduler_places_around_a_job_submitted_by_hand(world, hpc, slurm,
                                                              celery_worker_process):
    # A user with shell access holds both GPUs of n1 with their own sbatch.
    out = slurm.run("sbatch", "--parsable", "--job-name=by-hand", "--nodelist=n1",
                    "--gres=gpu:2", "--mem=100M", "--output=/dev/null", "--chdir=/tmp",
                    "--wrap", "sleep 600").stdout
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            cluster_sync_nodes(cluster=hpc)
            if Node.objects.get(cluster=hpc, name="n1").gpus_foreign == 2:
                break
            time.sleep(0.3)
        assert Node.objects.get(cluster=hpc, name="n1").gpus_foreign == 2
        queue = queue_create(actor=world.operator, tenant=world.alpha, name="default",
                             cluster=hpc)
        jobs = [job_submit(actor=world.alpha_member, tenant=world.alpha, queue=queue,
                           name=f"two-{i}", command=[sys.executable, "-c", "print(1)"],
                           gpus_per_replica=2, memory_mib_per_replica=256) for i in range(2)]
        for job in jobs:
            job = _wait(job, lambda j: j.state in FINAL_STATES)
            assert job.state == JobState.SUCCEEDED, job.reason
            assert job.attempts.get().placement == ["n2"]
    finally:
        slurm.run("scancel", out.strip().split(";")[0], check=False)


def test_a_cordon_drains_the_node_in_slurm_and_uncordon_resumes_it(world, hpc, slurm):
    node = Node.objects.get(cluster=hpc, name="n1")
    node_set_schedulable(actor=world.operator, node=node, schedulable=False,
                         reason="bad DIMM")
    cluster_sync_nodes(cluster=hpc)
    sinfo = {n.name: n for n in hpc.nodes.all()}
    assert not sinfo["n1"].schedulable and sinfo["n1"].health_reason == "bad DIMM"
    assert _slurm_node(slurm, "n1")["reason"] == "ogai: bad DIMM"
    node.refresh_from_db()
    node_set_schedulable(actor=world.operator, node=node, schedulable=True)
    cluster_sync_nodes(cluster=hpc)
    assert "DRAIN" not in _slurm_node(slurm, "n1")["state_flags"]
    node.refresh_from_db()
    assert node.schedulable
    # A drain an administrator set in Slurm is theirs: the platform keeps off, lifts nothing.
    slurm.run("scontrol", "update", "nodename=n2", "state=drain", "reason=firmware update")
    try:
        cluster_sync_nodes(cluster=hpc)
        n2 = Node.objects.get(cluster=hpc, name="n2")
        assert not n2.schedulable and n2.health_reason == "firmware update"
        assert _slurm_node(slurm, "n2")["reason"] == "firmware update"
    finally:
        slurm.run("scontrol", "update", "nodename=n2", "state=resume")


def _slurm_node(slurm, name):
    return next(n for n in json.loads(slurm.run("sinfo", "--json").stdout)["nodes"]
                if n["name"] == name)


@pytest.fixture
def checked(hpc):
    """The nodes passed every health check just now, so none falls due while the toolchain's
    longer runs go on (the beat's checks would otherwise hold the nodes for the exclusive ones
    and fail the network one: this machine's nodes have no SSH for it to reach)."""
    now = timezone.now()
    HealthCheckRun.objects.bulk_create(
        HealthCheckRun(node=node, check_name=name, severity=check.severity,
                       state=CheckState.PASSED, started_at=now, finished_at=now)
        for node in hpc.nodes.all() for name, check in health_checks().items())
    return hpc


def _wait_run(run, condition, what: str, timeout: float = 240.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if condition(run):
            return run
        if run.job is not None:
            run.job.refresh_from_db()
            if run.job.state in FINAL_STATES and run.job.state != JobState.SUCCEEDED:
                break
        time.sleep(0.3)
    job = run.job
    nodes = [(node.name, node.schedulable, node.health_reason)
             for node in Node.objects.filter(cluster=job.queue.cluster)] if job else []
    raise AssertionError(f"{run} never {what}: job {job and job.state} ({job and job.reason});"
                         f" message: {run.message}; nodes: {nodes}")


def test_a_pipeline_then_a_pretraining_run_on_slurm_read_and_write_the_data_as_anywhere(
        world, checked, slurm, live_server, settings, celery_worker_process):
    """The toolchain unchanged on a Slurm queue: the pipeline reads its dataset version and
    writes its run folder at their own paths, the platform records the output as the next
    version, and a pretraining run reads that and registers its model."""
    settings.OGAI_INTERNAL_URL = live_server.url
    queue = queue_create(actor=world.operator, tenant=world.alpha, name="default", cluster=checked)
    member = world.alpha_member
    source = uploaded_corpus(actor=member, tenant=world.alpha)
    steps = demo_steps(seq_len=64)

    pipeline = pipeline_run_start(actor=member, version=source, steps=steps, queue=queue,
                                  memory_mib=1024)
    pipeline = _wait_run(pipeline, lambda r: r.succeeded, "finished")
    tokens = pipeline.output_version
    assert tokens.format == "tokens" and tokens.parent == source and tokens.tokens > 1000
    assert pipeline.step_results[0]["docs_in"] == source.documents

    run = training_run_start(
        actor=member, dataset_version=tokens, queue=queue, kind="pretrain", name="tiny",
        model={"preset": "tiny"}, memory_mib=1024, max_restarts=0,
        training={"max_steps": 6, "batch_size": 4, "checkpoint_every": 3, "log_every": 2,
                  "warmup_steps": 1})
    run = _wait_run(run, lambda r: r.succeeded, "finished")
    assert run.artifact == "model" and Path(run.output_path, "config.json").exists()
    assert list(run.metrics.values_list("step", flat=True)) == [2, 4, 6]

    # Both ran on Slurm as the tenant's account; their folders live on the shared path.
    for finished in (pipeline, run):
        workload = finished.job.attempts.get().workload_id
        [ran] = [j for j in json.loads(slurm.run("squeue", "--json").stdout)["jobs"]
                 if j["name"] == workload]
        assert ran["user_id"] == tenant_uid(world.alpha.pk)
        folder = storage.absolute(finished.folder)
        assert folder.is_symlink()
        assert Path(checked.options["shared_dir"]) in Path(os.readlink(folder)).parents


def test_an_evaluation_on_slurm_scores_a_model_and_a_rerun_reads_its_cache(
        world, checked, live_server, settings, celery_worker_process):
    """lm-eval in a Slurm job: the version's weights and the benchmark read-only at their
    paths, the run folder and the tenant's request cache written; the cache, moved to the
    shared path by the first run, is found there by the second."""
    settings.OGAI_INTERNAL_URL = live_server.url
    queue = queue_create(actor=world.operator, tenant=world.alpha, name="default", cluster=checked)
    member = world.alpha_member
    # Weights of their own: the cache is per content, and the data directory outlives a run.
    seed = time.time_ns() % 2**31
    folder = tiny_model(Path(settings.DATA_DIR) / "models" / world.alpha.name
                        / f"slurm-tiny-{seed}", seed=seed)
    version = _version(world.alpha, "slurm-tiny", folder)
    benchmark = benchmark_create(actor=member, tenant=world.alpha, name="mc",
                                 kind="multiple_choice", data=jsonl(MC_DOCS))
    runs = []
    for _ in range(2):
        run = evaluation_start(actor=member, tenant=world.alpha, version=version,
                               benchmarks=[benchmark], queue=queue, limit=3)
        runs.append(_wait_run(run, lambda r: r.succeeded, "finished"))
    first, second = runs
    assert first.total_requests > 0 and first.cached_requests == 0
    assert second.cached_requests == second.total_requests == first.total_requests
    assert EvaluationResult.objects.filter(run=second, metric="acc").exists()
    assert first.job.attempts.get().workload_id != second.job.attempts.get().workload_id


@pytest.fixture
def fast_watch(monkeypatch):
    """For the worker started after it: the deployments' watch runs every second."""
    monkeypatch.setenv("OGAI_DEPLOYMENT_WATCH_S", "1")


def _ready_replica(deployment, timeout: float = 240.0) -> DeploymentReplica:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        replica = DeploymentReplica.objects.select_related("job").filter(
            deployment=deployment).first()
        if replica is not None and replica.ready and replica.job.state == JobState.RUNNING:
            return replica
        if replica is not None and replica.job is not None \
                and replica.job.state in FINAL_STATES:
            break
        time.sleep(0.5)
    job = replica.job if replica is not None else None
    raise AssertionError(f"the replica never answered: {replica and replica.message}; job "
                         f"{job and job.state} ({job and job.reason})")


def test_a_model_deployed_on_slurm_answers_through_the_gateway_from_its_node(
        world, checked, slurm, settings, fast_watch, celery_worker_process):
    """A model replica is a Slurm job of the tenant's account answering at its node's address
    on the port the node gave it; the gateway reaches it there, and nothing reaches it
    without the deployment's key."""
    queue = queue_create(actor=world.operator, tenant=world.alpha, name="default", cluster=checked)
    member = world.alpha_member
    seed = time.time_ns() % 2**31
    folder = tiny_model(Path(settings.DATA_DIR) / "models" / world.alpha.name
                        / f"slurm-serve-{seed}", seed=seed)
    deployment = deployment_create(
        actor=member, tenant=world.alpha, name="hpc-chat",
        version=_version(world.alpha, "slurm-serve", folder), queue=queue,
        cpu_per_replica=1, memory_mib_per_replica=1024)
    try:
        replica = _ready_replica(deployment)
        workload = replica.job.attempts.get().workload_id
        [ran] = [j for j in json.loads(slurm.run("squeue", "--json").stdout)["jobs"]
                 if j["name"] == workload]
        assert ran["user_id"] == tenant_uid(world.alpha.pk)
        address = _slurm_node(slurm, ran["nodes"])["address"]
        assert replica.upstream.startswith(f"http://{address}:")
        # The node's network reaches the replica; its key keeps everyone else out.
        direct = httpx.post(f"{replica.upstream}/v1/chat/completions", timeout=10, json={
            "model": replica.served_model, "messages": [{"role": "user", "content": "hi"}]})
        assert direct.status_code == 401

        key = api_token_create(actor=member, name="sdk", expires_at=None).secret
        with platform_server() as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
            deadline = time.monotonic() + 10
            while "hpc-chat" not in {model.id for model in client.models.list()}:
                assert time.monotonic() < deadline, "the gateway never lists the deployment"
                time.sleep(0.25)
            answer = client.chat.completions.create(
                model="hpc-chat", messages=[{"role": "user", "content": "Name a capital."}],
                max_tokens=8)
            assert answer.choices[0].message.content
            assert answer.usage.completion_tokens > 0
    finally:
        deployment_stop(actor=member, deployment=deployment)
    # The stop reaches Slurm: the replica's job ends there (after its grace period).
    deadline = time.monotonic() + 60
    while [j for j in json.loads(slurm.run("squeue", "--json").stdout)["jobs"]
           if j["name"] == workload and j["job_state"] in ("RUNNING", "PENDING")]:
        assert time.monotonic() < deadline, "the stopped replica still runs in Slurm"
        time.sleep(0.5)


def _signed_in(user) -> dict[str, str]:
    """The headers of a browser signed in to the platform as `user`."""
    client = Client()
    client.force_login(user)
    name = django_settings.SESSION_COOKIE_NAME
    return {"Cookie": f"{name}={client.cookies[name].value}"}


def test_a_notebook_on_slurm_opens_through_the_proxy_for_its_owner_only(
        world, checked, slurm, celery_worker_process):
    """JupyterLab as a Slurm job of the tenant's account, on the port its node gave it,
    reached through the platform's proxy with the platform's sign-in."""
    queue = queue_create(actor=world.operator, tenant=world.alpha, name="default", cluster=checked)
    notebook = notebook_start(actor=world.alpha_member, tenant=world.alpha, queue=queue,
                              name="hpc", cpu=1, memory_mib=1024)
    try:
        deadline = time.monotonic() + 120
        while notebook_state(notebook) != "running":
            assert time.monotonic() < deadline, (notebook_state(notebook), notebook.job.reason)
            time.sleep(0.5)
            notebook.refresh_from_db()
            notebook.job.refresh_from_db()
        workload = notebook.job.attempts.get().workload_id
        [ran] = [j for j in json.loads(slurm.run("squeue", "--json").stdout)["jobs"]
                 if j["name"] == workload]
        assert ran["user_id"] == tenant_uid(world.alpha.pk)
        status = f"/notebooks/{notebook.pk}/api/status"
        with platform_server() as url, httpx.Client(base_url=url, trust_env=False,
                                                    timeout=10) as http:
            deadline = time.monotonic() + 60
            while (answer := http.get(status, headers=_signed_in(
                    world.alpha_member))).status_code != 200:
                assert time.monotonic() < deadline, (answer.status_code, answer.text[:300])
                time.sleep(0.5)
            assert "kernels" in answer.json()
            # Another tenant's member is not let through, signed in or not.
            other = http.get(status, headers=_signed_in(world.beta_member))
            assert other.status_code == 404
            assert http.get(status).status_code == 302
    finally:
        notebook_stop(actor=world.alpha_member, notebook=notebook)
