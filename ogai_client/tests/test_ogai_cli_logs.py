"""`ogai logs search` and `ogai logs around` against the real API, served by `live_server`.

Lines reach the log store the way a job's output does: a job runs on the fake driver, its
replicas print (`append_log`) and `logs_ship()` ships them, in the test's thread. The CLI runs
in-process (`main([...])`), signed in through OGAI_URL/OGAI_TOKEN.
"""

import json
import re
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from aistation.services.log_shipping import logs_ship
from infra_os.services.tokens import api_token_create
from ogai_client import OgaiClient, cli, logs_cli
from ogai_client.models import LogLine

live = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """No real config, no real environment."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("OGAI_URL", raising=False)
    monkeypatch.delenv("OGAI_TOKEN", raising=False)


@pytest.fixture
def sign_in(live_server, monkeypatch):
    """`sign_in(user)`: the CLI's next commands run as that user."""

    def as_user(user):
        token = api_token_create(actor=user, name="test",
                                 expires_at=timezone.now() + timedelta(days=1)).secret
        monkeypatch.setenv("OGAI_URL", live_server.url)
        monkeypatch.setenv("OGAI_TOKEN", token)

    return as_user


@pytest.fixture
def job(farm, log_store):
    """alpha's 2-replica job `trainer`, running on the fake cluster."""
    job = farm.submit(replicas=2, name="trainer")
    farm.cycle()
    job.refresh_from_db()
    return job


def prints(farm, job, *lines, replica=0):
    """The job's replica prints these lines, and they are shipped to the log store. Each
    replica's line 1 is the fake's "started" line, so a replica's first printed line is 2."""
    workload = job.attempts.order_by("-number").first().workload_id
    for line in lines:
        farm.fake.append_log(workload, line, replica=replica)
    logs_ship()


def ogai(capsys, *argv, failure_is_an_error=True):
    """Run the CLI; returns (exit code, stdout lines, stderr). Every error is one stderr
    line."""
    code = cli.main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    if code != 0 and failure_is_an_error:
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1, captured.err
        assert lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.err
    return code, captured.out.splitlines(), captured.err


def where(line: str) -> str:
    """A printed hit without its time: `job J/attempt A/replica R:LINE  message`."""
    return re.sub(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ", "", line)


@live
def test_search_prints_each_hit_where_it_is_the_newest_last(farm, job, sign_in, capsys):
    prints(farm, job, "step 1 loss 2.5")
    prints(farm, job, "NCCL WARN net ib0 flapped", replica=1)
    prints(farm, job, "NCCL error: unhandled system error")
    sign_in(farm.world.alpha_member)

    code, out, err = ogai(capsys, "logs", "search", "NCCL", "--since", "1h")
    assert code == 0, err
    assert [where(line) for line in out] == [
        f"job {job.pk}/attempt 1/replica 1:2  NCCL WARN net ib0 flapped",
        f"job {job.pk}/attempt 1/replica 0:3  NCCL error: unhandled system error",
    ]

    # Words must all be there; a quoted phrase as it is; filters narrow.
    code, out, _ = ogai(capsys, "logs", "search", '"NCCL error"')
    assert [where(line) for line in out] == \
        [f"job {job.pk}/attempt 1/replica 0:3  NCCL error: unhandled system error"]
    code, out, _ = ogai(capsys, "logs", "search", "NCCL", "--job", job.pk, "--replica", 1)
    assert [where(line) for line in out] == \
        [f"job {job.pk}/attempt 1/replica 1:2  NCCL WARN net ib0 flapped"]
    code, out, _ = ogai(capsys, "logs", "search", "--level", "error")
    assert len(out) == 1 and out[0].endswith("NCCL error: unhandled system error")

    # The API's JSON, newest first, and the words found are what is highlighted.
    code, out, _ = ogai(capsys, "logs", "search", "NCCL", "--json")
    answer = json.loads("\n".join(out))
    assert [hit["message"] for hit in answer["results"]] == \
        ["NCCL error: unhandled system error", "NCCL WARN net ib0 flapped"]
    assert answer["more"] is False
    shown = logs_cli.hit(LogLine.from_api(answer["results"][0]))
    assert [shown.plain[span.start:span.end] for span in shown.spans
            if span.style == logs_cli.MATCH_STYLE] == ["NCCL"]

    # More than --limit: the newest, and a note that older ones were left out.
    code, out, err = ogai(capsys, "logs", "search", "NCCL", "--limit", 1)
    assert [where(line) for line in out] == \
        [f"job {job.pk}/attempt 1/replica 0:3  NCCL error: unhandled system error"]
    assert "older ones are left out" in err


@live
def test_around_shows_the_neighbours_in_order_the_asked_one_marked(farm, job, sign_in,
                                                                  capsys):
    prints(farm, job, *(f"step {i}" + (" CUDA out of memory" if i == 15 else "")
                        for i in range(1, 31)))
    sign_in(farm.world.alpha_member)
    code, out, err = ogai(capsys, "logs", "search", "out of memory")
    assert code == 0, err
    line = int(re.search(r"replica 0:(\d+)  ", out[0])[1])
    assert line == 16  # after the "started" line

    code, out, err = ogai(capsys, "logs", "around", job.pk, "--line", line, "--context", 2,
                          "--q", "memory")
    assert code == 0, err
    assert out == ["  14  step 13", "  15  step 14", "> 16  step 15 CUDA out of memory",
                   "  17  step 16", "  18  step 17"]
    assert f"job {job.pk}/attempt 1/replica 0: lines 14-18" in err

    code, out, err = ogai(capsys, "logs", "around", job.pk, "--line", 31, "--context", 3)
    assert code == 0 and out[-1] == "> 31  step 30"
    code, _, err = ogai(capsys, "logs", "around", job.pk, "--line", 33, "--context", 3)
    assert code == 1
    assert f"job {job.pk}/attempt 1/replica 0 has no line 33 (its last is line 31)" in err


@live
def test_the_sdk_searches_counts_and_reads_around(farm, job, sign_in):
    prints(farm, job, *(f"step {i}" + (" CUDA out of memory" if i == 15 else "")
                        for i in range(1, 31)))
    sign_in(farm.world.alpha_member)
    with OgaiClient.from_env() as client:
        found = client.log_search("memory", since=timedelta(hours=1), job=job.pk)
        assert [(h.job, h.attempt, h.replica, h.line, h.source) for h in found.results] == \
            [(job.pk, 1, 0, 16, "job")]
        assert found.results[0].highlights == [(20, 26)] and not found.more
        assert client.log_search("memory", until=datetime.now() - timedelta(hours=1)
                                 ).results == []
        histogram = client.log_histogram("step", since="1h", buckets=12)
        assert histogram.total == 30 and len(histogram.buckets) == 12
        assert sum(bucket.count for bucket in histogram.buckets) == 30
        around = client.log_around(job.pk, line=16, context=1, q="memory")
        assert (around.attempt, around.replica) == (1, 0)
        assert [(line.line, line.message) for line in around.lines] == \
            [(15, "step 14"), (16, "step 15 CUDA out of memory"), (17, "step 16")]


@live
def test_follow_prints_new_matching_lines_until_ctrl_c(farm, job, sign_in, capsys,
                                                       monkeypatch):
    prints(farm, job, "NCCL init ok", "loss 2.0")
    sign_in(farm.world.alpha_member)
    polls = []

    def pause(seconds):
        polls.append(seconds)
        if len(polls) == 1:
            prints(farm, job, "loss 1.9", "NCCL timeout on rank 3")
            prints(farm, job, "NCCL abort", replica=1)
        else:
            raise KeyboardInterrupt

    monkeypatch.setattr(logs_cli, "_pause", pause)
    code, out, err = ogai(capsys, "logs", "search", "NCCL", "--follow")
    assert code == 0, err
    assert [where(line) for line in out] == [
        f"job {job.pk}/attempt 1/replica 0:2  NCCL init ok",
        f"job {job.pk}/attempt 1/replica 0:5  NCCL timeout on rank 3",
        f"job {job.pk}/attempt 1/replica 1:2  NCCL abort",
    ]
    assert polls == [2.0, 2.0]


@live
def test_another_tenants_user_sees_nothing(farm, job, sign_in, capsys):
    prints(farm, job, "alpha secret token-xyz in NCCL init")
    sign_in(farm.world.alpha_member)
    code, out, _ = ogai(capsys, "logs", "search", "secret")
    assert code == 0 and len(out) == 1

    sign_in(farm.world.beta_member)
    code, out, err = ogai(capsys, "logs", "search", "secret")
    assert code == 0 and out == []
    assert "no lines match" in err
    code, out, _ = ogai(capsys, "logs", "search", "--since", "7d")
    assert out == []
    for argv in (("search", "secret", "--job", job.pk), ("around", job.pk, "--line", 2)):
        code, out, err = ogai(capsys, "logs", *argv)
        assert code == 1 and out == []
        assert f"job {job.pk} not found (or not visible to you)" in err


@pytest.mark.parametrize("argv,named", [
    (("search", "NCCL", "--since", "yesterday"), "--since"),
    (("search", "--until", "soon"), "--until"),
    (("search", "--attempt", "2"), "--job"),
    (("search", "--limit", "5000"), "--limit"),
    (("search", "--level", "loud"), "--level"),
    (("search", "-f", "--until", "1h"), "--until"),
    (("around", "x", "--line", "3"), "job id"),
    (("around", "3"), "--line"),
    (("around", "3", "--line", "0"), "--line"),
])
def test_bad_input_is_one_line_naming_it(argv, named, capsys):
    code, out, err = ogai(capsys, "logs", *argv)
    assert code == 2 and out == []
    assert named in err


@live
def test_the_servers_refusal_is_one_line(world, sign_in, log_store, capsys):
    sign_in(world.alpha_member)
    code, _, err = ogai(capsys, "logs", "search", "--since", "1h", "--until", "2h")
    assert code == 1
    assert "until" in err
