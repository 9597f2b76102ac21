"""The `ogai` CLI and the SDK against the real API, served by `live_server`.

The CLI runs in-process (`main([...])`), its URL and token from OGAI_URL/OGAI_TOKEN and its
config file under tmp_path. Jobs run on the fake driver; scheduling cycles and reconcile run in
the test's thread, between the CLI's polls, so nothing races.
"""

import io
import json
import os
import socket
import stat
from datetime import timedelta

import pytest
import yaml
from django.utils import timezone

from aistation.choices import JobState
from aistation.models import Job, Workdir
from aistation.services.queues import queue_create
from aistation.services.reconcile import reconcile_cluster
from aistation.services.scheduling import schedule_cluster
from infra_os.models import ApiToken
from infra_os.services.tokens import api_token_create
from ogai_client import OgaiClient, OgaiError, cli
from podsys.drivers.fake import fake_cluster
from podsys.models import Cluster, Node
from podsys.services.clusters import cluster_refresh_capacity, cluster_sync_nodes

pytestmark = pytest.mark.django_db(transaction=True)

CLUSTER = "fake-test"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """No real config, no real environment (the root conftest resets fake clusters)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("OGAI_URL", raising=False)
    monkeypatch.delenv("OGAI_TOKEN", raising=False)


@pytest.fixture
def cluster(world, settings):
    settings.OGAI_RETRY_BACKOFF_S = 0
    cluster = Cluster.objects.create(name=CLUSTER, driver="fake",
                                     options={"nodes": 2, "gpus_per_node": 8})
    cluster_sync_nodes(cluster=cluster)
    queue_create(actor=world.alpha_admin, tenant=world.alpha, name="default", cluster=cluster)
    return cluster


def token_for(user) -> str:
    return api_token_create(actor=user, name="test",
                            expires_at=timezone.now() + timedelta(days=1)).secret


@pytest.fixture
def as_member(world, live_server, monkeypatch):
    """The CLI signed in as alpha-member through the environment."""
    monkeypatch.setenv("OGAI_URL", live_server.url)
    monkeypatch.setenv("OGAI_TOKEN", token_for(world.alpha_member))
    return world.alpha_member


def ogai(capsys, *argv, failure_is_an_error=True):
    """Run the CLI; returns (exit code, stdout, stderr). Every error is one stderr line (a
    followed job that failed exits 1 too, after its progress notes)."""
    code = cli.main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    if code != 0 and failure_is_an_error:
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1, captured.err
        assert lines[0].startswith("error: "), captured.err
        assert "Traceback" not in captured.err
    return code, captured.out, captured.err


def write_spec(tmp_path, name="spec.yaml", **changes):
    spec = {"name": "train-gpt", "command": ["python", "train.py", "--lr", "3e-4"],
            "env": {"OGAI_FAKE_DURATION_S": "30"},
            "resources": {"gpus": 2, "cpu": 4, "memory": "16Gi"}}
    spec.update(changes)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec) if name.endswith(".yaml") else json.dumps(spec))
    return path


# -- login and identity -------------------------------------------------------------------------

def test_login_with_a_password_stores_a_token_that_works(world, live_server, password,
                                                         monkeypatch, capsys, tmp_path):
    asked = []
    monkeypatch.setattr(cli.getpass, "getpass", lambda prompt: asked.append(prompt) or password)
    code, out, err = ogai(capsys, "login", "--url", live_server.url, "--username", "alpha-member")
    assert code == 0, err
    assert "alpha-member" in out
    assert asked and "alpha-member" in asked[0]

    path = tmp_path / "config" / "ogai" / "config.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    stored = json.loads(path.read_text())
    assert stored["url"] == live_server.url
    token = ApiToken.objects.get(user=world.alpha_member)
    assert token.name == f"cli on {socket.gethostname()}"
    assert stored["token"].startswith(f"ogai_{token.prefix}")

    # The stored token alone signs later commands in (no environment).
    code, out, err = ogai(capsys, "whoami")
    assert code == 0, err
    assert "alpha-member" in out
    assert "alpha (member)" in out


def test_login_reads_the_password_from_stdin(world, live_server, password, monkeypatch,
                                            capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{password}\n"))
    code, _, err = ogai(capsys, "login", "--url", live_server.url, "-u", "alpha-admin",
                          "--password-stdin", "--expires-in-days", 7)
    assert code == 0, err
    token = ApiToken.objects.get(user=world.alpha_admin)
    assert timedelta(days=6) < token.expires_at - timezone.now() <= timedelta(days=7)


def test_a_viewer_logs_in_with_a_read_only_token(world, live_server, password, monkeypatch,
                                                 capsys):
    monkeypatch.setattr(cli.getpass, "getpass", lambda prompt: password)
    code, _, err = ogai(capsys, "login", "--url", live_server.url, "-u", "alpha-viewer")
    assert code == 0, err
    code, out, _ = ogai(capsys, "whoami")
    assert code == 0
    assert "alpha-viewer" in out


def test_login_with_a_wrong_password_says_so(world, live_server, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(cli.getpass, "getpass", lambda prompt: "wrong")
    code, _, err = ogai(capsys, "login", "--url", live_server.url, "-u", "alpha-member")
    assert code == 1
    assert "username or password is wrong" in err
    assert not (tmp_path / "config" / "ogai" / "config.json").exists()


def test_login_with_a_token_checks_it_before_storing_it(world, live_server, capsys, tmp_path):
    code, out, err = ogai(capsys, "login", "--url", live_server.url, "--token", "ogai_nope_x")
    assert code == 1
    assert "ogai login" in err
    assert not (tmp_path / "config" / "ogai" / "config.json").exists()

    code, out, err = ogai(capsys, "login", "--url", live_server.url + "/",
                          "--token", token_for(world.alpha_admin))
    assert code == 0, err
    assert "alpha-admin" in out
    assert ogai(capsys, "whoami")[1].startswith("alpha-admin")


def test_the_sdk_logs_in_with_a_password(world, live_server, password):
    with OgaiClient(live_server.url) as client:
        token = client.login("alpha-admin", password, token_name="notebook")
        assert client.me().username == "alpha-admin"
    assert OgaiClient(live_server.url, token).me().memberships[0].role == "admin"
    assert ApiToken.objects.get(user=world.alpha_admin).name == "notebook"


def test_a_missing_token_says_to_run_ogai_login(live_server, monkeypatch, capsys):
    code, _, err = ogai(capsys, "whoami")
    assert code == 1
    assert "ogai login" in err
    monkeypatch.setenv("OGAI_URL", live_server.url)
    code, _, err = ogai(capsys, "job", "list")
    assert code == 1
    assert "ogai login" in err
    assert live_server.url in err


def test_a_revoked_token_says_to_log_in_again(world, live_server, monkeypatch, capsys):
    monkeypatch.setenv("OGAI_URL", live_server.url)
    monkeypatch.setenv("OGAI_TOKEN", token_for(world.alpha_member))
    ApiToken.objects.update(revoked_at=timezone.now())
    code, _, err = ogai(capsys, "whoami")
    assert code == 1
    assert "revoked" in err and "ogai login" in err


# -- jobs ---------------------------------------------------------------------------------------

def test_submit_list_show_cancel_and_rerun(as_member, cluster, capsys, tmp_path):
    code, out, err = ogai(capsys, "job", "submit", write_spec(tmp_path))
    assert code == 0, err
    job = Job.objects.get()
    assert f"job {job.pk} submitted" in out
    assert "queued" in out
    assert job.state == JobState.QUEUED
    assert job.memory_mib_per_replica == 16 * 1024
    assert job.command == ["python", "train.py", "--lr", "3e-4"]

    code, out, err = ogai(capsys, "job", "list")
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.strip().startswith(str(job.pk)))
    assert "train-gpt" in row and "default" in row and "queued" in row
    assert "submitted; waiting for the scheduler" in row

    code, out, err = ogai(capsys, "job", "show", job.pk)
    assert code == 0, err
    assert "python train.py --lr 3e-4" in out
    assert "events" in out
    assert "submitted; waiting for the scheduler" in out
    assert "16Gi" in out

    code, out, err = ogai(capsys, "job", "cancel", job.pk)
    assert code == 0, err
    assert "cancelled" in out
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED

    code, out, _ = ogai(capsys, "job", "list", "--state", "queued")
    assert str(job.pk) not in out
    code, out, _ = ogai(capsys, "job", "list", "--state", "cancelled,failed", "--all")
    assert "train-gpt" in out and "cancelled" in out

    code, out, err = ogai(capsys, "job", "show", job.pk)
    assert "cancelled by alpha-member" in out

    # Cancelling twice says why not, in one line naming the field.
    code, _, err = ogai(capsys, "job", "cancel", job.pk)
    assert code == 1
    assert "already cancelled" in err

    code, out, err = ogai(capsys, "job", "rerun", job.pk)
    assert code == 0, err
    rerun = Job.objects.exclude(pk=job.pk).get()
    assert rerun.rerun_of_id == job.pk
    assert f"job {rerun.pk} submitted as a rerun of job {job.pk}" in out


def test_submit_from_stdin_refuses_a_typo(as_member, cluster, capsys, monkeypatch, tmp_path):
    spec = json.dumps({"name": "from-stdin", "command": ["true"], "resources": {"gpus": 1},
                       "replica": 2})
    monkeypatch.setattr("sys.stdin", io.StringIO(spec))
    code, _, err = ogai(capsys, "job", "submit", "-", "--tenant", "alpha", "--queue",
                        "default", "--name", "renamed", "-q")
    # A typo is refused by the API, not silently dropped.
    assert code == 1
    assert "replica: Unknown field." in err
    assert not Job.objects.exists()


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"command": "python train.py"}, "command", "list"),
    ({"resources": {"gpus": 999}}, "resources.gpus", "largest node"),
    ({"resources": {"gpus": 16}}, "resources.gpus", "16 GPUs per replica, but the largest"),
    ({"resources": {"gpus": 1, "memory": "lots"}}, "resources.memory", "16Gi"),
    ({"queue": "nope"}, "queue", "No queue 'nope'"),
])
def test_a_bad_spec_exits_1_with_one_line_naming_the_field(as_member, cluster, capsys, tmp_path,
                                                           changes, field, words):
    code, _, err = ogai(capsys, "job", "submit", write_spec(tmp_path, **changes))
    assert code == 1
    assert err.startswith(f"error: {field}: "), err
    assert words in err
    assert not Job.objects.exists()


def test_a_spec_file_that_cannot_be_read_says_so(as_member, cluster, capsys, tmp_path):
    code, _, err = ogai(capsys, "job", "submit", tmp_path / "missing.yaml")
    assert code == 1 and "cannot read" in err
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    code, _, err = ogai(capsys, "job", "submit", broken)
    assert code == 1 and "not valid YAML" in err and "line" in err
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    code, _, err = ogai(capsys, "job", "submit", listing)
    assert code == 1 and "mapping" in err


def test_a_viewer_cannot_submit(world, live_server, cluster, monkeypatch, capsys, tmp_path):
    # A member demoted to viewer: their token now acts as a viewer.
    monkeypatch.setenv("OGAI_URL", live_server.url)
    monkeypatch.setenv("OGAI_TOKEN", token_for(world.alpha_member))
    world.alpha_member.memberships.update(role="viewer")
    code, _, err = ogai(capsys, "job", "submit", write_spec(tmp_path), "--tenant", "alpha")
    assert code == 1
    assert "viewer" in err.lower()


@pytest.mark.parametrize("argv", [
    ("job", "show", 999999), ("job", "cancel", 999999), ("job", "rerun", 999999),
    ("job", "logs", 999999), ("job", "logs", "-f", 999999), ("job", "render", 999999),
])
def test_an_unknown_job_is_not_found(as_member, cluster, capsys, argv):
    code, _, err = ogai(capsys, *argv)
    assert code == 1
    assert "job 999999 not found" in err


def test_another_tenants_job_is_not_found(world, live_server, cluster, monkeypatch, capsys,
                                          tmp_path):
    monkeypatch.setenv("OGAI_URL", live_server.url)
    monkeypatch.setenv("OGAI_TOKEN", token_for(world.alpha_member))
    assert ogai(capsys, "job", "submit", write_spec(tmp_path))[0] == 0
    job = Job.objects.get()
    monkeypatch.setenv("OGAI_TOKEN", token_for(world.beta_member))
    for command in ("show", "render"):
        code, _, err = ogai(capsys, "job", command, job.pk)
        assert code == 1 and "not found" in err


def test_logs_of_a_job_not_started_print_nothing(as_member, cluster, capsys, tmp_path):
    ogai(capsys, "job", "submit", write_spec(tmp_path))
    job = Job.objects.get()
    code, out, err = ogai(capsys, "job", "logs", job.pk)
    assert code == 0, err
    assert out == ""


def test_logs_of_a_running_job(as_member, cluster, capsys, tmp_path):
    ogai(capsys, "job", "submit", write_spec(tmp_path))
    job = Job.objects.get()
    schedule_cluster(cluster_id=cluster.pk)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    workload = job.attempts.get().workload_id
    for step in range(5):
        fake_cluster(CLUSTER).append_log(workload, f"step {step}")
    code, out, err = ogai(capsys, "job", "logs", "--tail", 2, job.pk)
    assert code == 0, err
    assert out == "step 3\nstep 4\n"
    code, out, err = ogai(capsys, "job", "logs", "--replica", 3, job.pk)
    assert code == 1 and err.startswith("error: replica: ")
    code, out, err = ogai(capsys, "job", "logs", "--attempt", 2, job.pk)
    assert code == 1 and f"job {job.pk} has no attempt 2" in err
    code, out, err = ogai(capsys, "job", "logs", "--attempt", 1, "-n", 1, job.pk)
    assert (code, out) == (0, "step 4\n")

    code, out, err = ogai(capsys, "job", "list", "--state", "running")
    assert "running" in out and "2" in out

    ogai(capsys, "job", "cancel", job.pk)
    code, out, err = ogai(capsys, "job", "logs", "-f", "--attempt", 2, job.pk,
                          failure_is_an_error=False)
    assert code == 1
    assert err.splitlines()[-1] == f"error: job {job.pk} ended without an attempt 2"


class World:
    """Moves the fake cluster on each time the CLI pauses between two polls: a few log lines
    and 10 s of the clock per pause; reconcile records the end."""

    def __init__(self, cluster, job, lines_per_pause=3):
        self.cluster = cluster
        self.job = job
        self.lines_per_pause = lines_per_pause
        self.printed: list[str] = []
        self.pauses = 0

    def pause(self, seconds):
        self.pauses += 1
        assert self.pauses < 50, "the CLI did not stop following"
        fake = fake_cluster(CLUSTER)
        attempt = self.job.attempts.order_by("-number").first()
        if attempt is not None:
            for _ in range(self.lines_per_pause):
                line = f"step {len(self.printed)} loss {1 / (len(self.printed) + 1):.3f}"
                fake.append_log(attempt.workload_id, line)
                self.printed.append(line)
            fake.advance(10)
        reconcile_cluster(cluster=self.cluster)
        schedule_cluster(cluster_id=self.cluster.pk)


def test_logs_follow_prints_each_line_once_and_exits_0_on_success(
        as_member, cluster, capsys, tmp_path, monkeypatch):
    ogai(capsys, "job", "submit", write_spec(tmp_path))  # runs 30 s of the fake clock
    job = Job.objects.get()
    world = World(cluster, job)
    monkeypatch.setattr(cli, "_pause", world.pause)
    # The first poll finds it queued; the first pause schedules it.
    code, out, err = ogai(capsys, "job", "logs", "-f", job.pk)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("replica 0 started on fake-node-")
    assert lines[1:-1] == world.printed
    assert lines[-1] == "replica 0 ended at t=30.0: exited with code 0"
    assert "queued" in err and "succeeded" in err
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED


def test_logs_follow_with_a_window_smaller_than_the_burst_reports_the_gap(
        as_member, cluster, capsys, tmp_path, monkeypatch):
    ogai(capsys, "job", "submit", write_spec(tmp_path, env={"OGAI_FAKE_DURATION_S": "20",
                                                            "OGAI_FAKE_EXIT_CODE": "3"}))
    job = Job.objects.get()
    schedule_cluster(cluster_id=cluster.pk)
    world = World(cluster, job, lines_per_pause=1200)  # more than the 1000-line window
    monkeypatch.setattr(cli, "_pause", world.pause)
    code, out, err = ogai(capsys, "job", "logs", "-f", "--tail", 0, job.pk,
                          failure_is_an_error=False)
    assert code == 1  # the job failed (exit code 3)
    assert "lines skipped" in err
    assert "failed" in err
    assert out.splitlines()[-1].startswith("replica 0 ended at t=20.0")
    assert len(out.splitlines()) == len(set(out.splitlines()))  # nothing printed twice


def test_submit_follow_exits_1_when_the_job_fails(as_member, cluster, capsys, tmp_path,
                                                  monkeypatch):
    spec = write_spec(tmp_path, env={"OGAI_FAKE_DURATION_S": "5", "OGAI_FAKE_EXIT_CODE": "2"})
    world = World(cluster, None)

    def pause(seconds):
        world.job = Job.objects.get()
        world.pause(seconds)

    monkeypatch.setattr(cli, "_pause", pause)
    code, out, err = ogai(capsys, "job", "submit", spec, "--follow", failure_is_an_error=False)
    assert code == 1
    assert "failed" in err
    assert "submitted" in out
    assert "exit code 2" in out.splitlines()[-1]


# -- queues -------------------------------------------------------------------------------------

def test_queue_status_shows_backlog_gpus_and_the_quota(as_member, cluster, capsys, tmp_path):
    for gpus in (2, 4):
        ogai(capsys, "job", "submit", write_spec(tmp_path, resources={"gpus": gpus}))
    # 2 x 8 GPUs: more than the quota and more than the 10 GPUs left idle, so it waits.
    ogai(capsys, "job", "submit", write_spec(tmp_path, resources={"gpus": 8}, replicas=2))
    schedule_cluster(cluster_id=cluster.pk)  # the 8-GPU quota holds 2 + 4
    running = Job.objects.filter(state=JobState.RUNNING)
    assert sorted(job.gpus_per_replica for job in running) == [2, 4]
    # As if the 4-GPU job had borrowed idle capacity: it does not count against the quota.
    running.filter(gpus_per_replica=4).update(borrowed=True)
    in_quota, borrowed = 2, 4
    code, out, err = ogai(capsys, "queue", "status")
    assert code == 0, err
    rows = [line.split() for line in out.splitlines() if line.startswith("alpha")]
    assert rows[0] == ["alpha", "default", CLUSTER, "fair", "1", "2",
                       str(in_quota + borrowed), "/", "∞"]
    assert rows[1] == ["alpha", str(in_quota), "/", "8", str(borrowed), "64", "512", "GiB", "-"]

    code, out, _ = ogai(capsys, "queue", "status", "--json")
    data = json.loads(out)
    assert data["queues"][0]["pending"] == 1
    assert data["quotas"][0]["gpus"] == 8


def test_the_sdk_submits_lists_and_pages(as_member, cluster, live_server, monkeypatch):
    client = OgaiClient.from_config()
    for index in range(5):
        job = client.submit_job({"name": f"sdk-{index}", "command": ["true"],
                                 "resources": {"memory": "512Mi"}})
        assert job.state == "queued"
        assert job.resources.memory_mib == 512
        assert job.events[0].to_state == "queued"
    monkeypatch.setattr("ogai_client.client.PAGE_SIZE", 2)
    jobs = client.jobs(state=["queued"])
    assert [job.name for job in jobs] == [f"sdk-{index}" for index in reversed(range(5))]
    page = client.job_page(limit=2, offset=4)
    assert page.count == 5 and len(page.results) == 1 and not page.has_more
    assert client.queues()[0].pending == 5
    assert client.quotas()[0].gpus == 8
    with pytest.raises(OgaiError) as raised:
        client.submit_job({"name": "x", "command": "true"})
    assert raised.value.code == "invalid"
    assert raised.value.status == 400
    assert "command" in raised.value.fields


@pytest.fixture
def kube_cluster(world):
    """A Kubernetes cluster known by its nodes only (rendering never reaches it), with alpha's
    queue `k8s`."""
    cluster = Cluster.objects.create(name="k8s", driver="kubernetes", options={})
    Node.objects.create(cluster=cluster, name="gpu-0", gpus=8, cpu_cores=64, memory_mib=524288)
    cluster_refresh_capacity(cluster=cluster)
    queue_create(actor=world.alpha_admin, tenant=world.alpha, name="k8s", cluster=cluster)
    return cluster


def test_render_prints_the_kubernetes_objects_as_yaml(world, as_member, kube_cluster, capsys,
                                                      tmp_path):
    # This cluster has no artifacts volume: a working folder is refused at submission.
    code, out, err = ogai(capsys, "job", "submit", write_spec(
        tmp_path, image="registry.example.org/train:1", queue="k8s"))
    assert code == 1 and "Cluster k8s cannot ship a working folder" in err
    assert len(err.strip().splitlines()) == 1, err
    ogai(capsys, "job", "submit", write_spec(tmp_path, image="registry.example.org/train:1",
                                             queue="k8s"), "--no-workdir")
    job = Job.objects.get()
    code, out, err = ogai(capsys, "job", "render", job.pk)
    assert code == 0, err
    objects = list(yaml.safe_load_all(out))
    assert [o["kind"] for o in objects] == ["NetworkPolicy", "Service", "Job"]
    container = objects[2]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example.org/train:1"
    assert container["command"] == job.command
    with OgaiClient(os.environ["OGAI_URL"], os.environ["OGAI_TOKEN"]) as client:
        assert client.job_manifests(job.pk).strip() == out.strip()


def test_render_of_a_job_without_an_image_says_why(as_member, kube_cluster, capsys, tmp_path):
    ogai(capsys, "job", "submit", write_spec(tmp_path, queue="k8s"), "--no-workdir")
    code, out, err = ogai(capsys, "job", "render", Job.objects.get().pk)
    assert code == 1 and not out
    assert "no image" in err


# -- working folders ----------------------------------------------------------------------------

def write_project(tmp_path, **changes):
    """A spec beside its train.py, as the README shows it; checkpoints are git-ignored."""
    folder = tmp_path / "project"
    folder.mkdir(exist_ok=True)
    (folder / "train.py").write_text("print('training')\n")
    (folder / ".gitignore").write_text("*.ckpt\n")
    (folder / "old.ckpt").write_bytes(b"\0" * 4096)
    return write_spec(folder, name="train.yaml", **changes), folder


def test_submit_ships_the_spec_folder_and_reuses_it(world, as_member, cluster, capsys,
                                                    tmp_path):
    spec, _ = write_project(tmp_path)
    code, out, err = ogai(capsys, "job", "submit", spec)
    assert code == 0, err
    workdir = Workdir.objects.get()
    assert workdir.tenant == world.alpha and workdir.created_by == world.alpha_member
    assert sorted(item["path"] for item in workdir.files) == [".gitignore", "train.py",
                                                              "train.yaml"]
    assert f"sha256 {workdir.sha256[:12]}…; uploaded)" in err
    job = Job.objects.get()
    assert job.workdir == workdir

    code, out, err = ogai(capsys, "job", "submit", spec)
    assert code == 0, err
    assert err.rstrip().endswith("; reused)")
    assert Workdir.objects.count() == 1
    assert {job.workdir_id for job in Job.objects.all()} == {workdir.pk}

    code, out, err = ogai(capsys, "job", "show", job.pk)
    assert code == 0, err
    assert f"sha256 {workdir.sha256[:12]}…" in out and "3 files" in out
    code, out, err = ogai(capsys, "job", "files", job.pk)
    assert code == 0, err
    assert "train.py" in out and "old.ckpt" not in out

    assert ogai(capsys, "job", "cancel", job.pk)[0] == 0
    assert ogai(capsys, "job", "rerun", job.pk)[0] == 0
    assert Job.objects.get(rerun_of=job).workdir == workdir

    code, _, err = ogai(capsys, "job", "submit", spec, "--no-workdir")
    assert code == 0 and "shipped" not in err
    assert Job.objects.order_by("-pk").first().workdir is None


def test_another_tenant_cannot_see_or_use_a_working_folder(world, as_member, cluster,
                                                           live_server, monkeypatch, capsys,
                                                           tmp_path):
    spec, folder = write_project(tmp_path)
    assert ogai(capsys, "job", "submit", spec)[0] == 0
    workdir = Workdir.objects.get()
    monkeypatch.setenv("OGAI_TOKEN", token_for(world.beta_member))
    client = OgaiClient.from_config()
    with pytest.raises(OgaiError) as raised:
        client.workdir(workdir.pk)
    assert raised.value.status == 404
    assert client.find_workdir("alpha", workdir.sha256) is None
    queue_create(actor=world.beta_admin, tenant=world.beta, name="default", cluster=cluster)
    stolen = write_spec(tmp_path, name="stolen.yaml", workdir=workdir.pk)
    code, _, err = ogai(capsys, "job", "submit", stolen)
    assert code == 1 and "no such working folder" in err.lower()
    # The same files uploaded by beta are beta's own archive, not a way into alpha's.
    mine = client.upload_workdir("beta", folder)
    assert not mine.reused and mine.id != workdir.pk and mine.sha256 == workdir.sha256


def test_a_working_folder_over_the_limit_is_one_line_and_sends_nothing(as_member, cluster,
                                                                       settings, capsys,
                                                                       tmp_path):
    settings.OGAI_WORKDIR_MAX_MB = 1
    spec, folder = write_project(tmp_path)
    (folder / "weights.bin").write_bytes(b"\0" * (2 * 1024 * 1024))
    code, _, err = ogai(capsys, "job", "submit", spec)
    assert code == 1
    assert "is 2 MiB, over the platform's limit of 1 MiB; list what it need not ship in " \
        ".ogaiignore (biggest: weights.bin 2 MiB" in err
    assert not Workdir.objects.exists() and not Job.objects.exists()
    (folder / ".ogaiignore").write_text("weights.bin\n")
    assert ogai(capsys, "job", "submit", spec)[0] == 0
    assert Workdir.objects.get().file_count == 4


def test_render_on_the_fake_cluster_prints_the_workload(as_member, cluster, capsys, tmp_path):
    ogai(capsys, "job", "submit", write_spec(tmp_path))
    job = Job.objects.get()
    code, out, err = ogai(capsys, "job", "render", job.pk)
    assert code == 0, err
    shown = yaml.safe_load(out)
    assert shown["id"] == f"job-{job.pk}-a1" and shown["command"] == job.command
