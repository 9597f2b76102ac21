"""`ogai deploy create -w`, `ogai deploy show` and `ogai train -f` say why the work waits, in
the scheduler's words, on the box of tests/test_wait_reasons.py (3 CPU cores, the demo
deployment holding 2)."""

import json

from ogai_client import cli
from ogai_client.tests.test_ogai_cli_mmodel import _isolated, as_member, live, ogai, words
from tests.test_wait_reasons import WAITING, box, tokens
from ylink.models import TrainingRun
from ylink.services.training import training_run_cancel

__all__ = ["_isolated", "as_member", "box"]  # fixtures used here


@live
def test_deploy_create_wait_shows_the_reason_and_times_out_with_it(box, as_member, capsys,
                                                                  monkeypatch):
    monkeypatch.setattr(cli, "_pause", lambda seconds: box.cycle())
    code, _, err = ogai(capsys, "deploy", "create", "second", "--version", "tiny", "-w",
                        "--timeout", 4, failure_is_an_error=False)
    assert code == 1
    assert f"deployment second: starting, 0/1 replicas ready — {WAITING}" in err
    assert err.strip().splitlines()[-1] == (
        f"error: deployment second is still starting after 4 s (0/1 replicas ready) — {WAITING}")

    code, out, err = ogai(capsys, "deploy", "show", "second")
    assert code == 0, err
    assert f"scheduler {WAITING}" in words(out)
    lines = out.splitlines()
    replicas = words("\n".join(lines[[line.strip() for line in lines].index("replicas"):]))
    assert f"queued no - {WAITING}" in replicas, "the replica's row says why its job waits"


@live
def test_train_follow_shows_why_its_job_waits(box, as_member, world, capsys, monkeypatch,
                                              tmp_path):
    tokens(world)
    polls = []

    def pause(seconds):
        polls.append(seconds)
        box.cycle()
        if len(polls) == 2:  # seen waiting: give up on it
            training_run_cancel(actor=world.alpha_member, run=TrainingRun.objects.get())

    monkeypatch.setattr(cli, "_pause", pause)
    spec = tmp_path / "train.json"
    spec.write_text(json.dumps({"kind": "pretrain", "dataset": "corpus", "name": "tiny-gpt",
                                "model": {"preset": "tiny"}, "training": {"max_steps": 20},
                                "resources": {"cpu": 2}}))
    code, _, err = ogai(capsys, "train", "-f", spec, "--queue", "default",
                        failure_is_an_error=False)
    run = TrainingRun.objects.get()
    assert f"training run {run.pk}: queued ({WAITING})" in err
    assert code == 1 and err.strip().splitlines()[-1].startswith(
        f"error: training run {run.pk} cancelled")
