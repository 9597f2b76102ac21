"""A newcomer's first hour, as they live it: `make run` from a fresh data directory, sign in in
the browser, ship their own `train.py` (it imports torch) with `ogai job submit`, see a second
deployment wait on a machine whose CPUs are taken and read why, in the console and in
`ogai deploy create -w`; then Ctrl-C, and nothing of the platform is left running."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from mmodel.tests.tiny import tiny_model
from tests.platform_process import free_port, processes_using

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
DEMO_PASSWORD = "Smoke-test-pass-1"
OGAI = str(Path(sys.prefix) / "bin" / "ogai")

TRAIN_PY = """\
import sys
import torch

steps = int(sys.argv[sys.argv.index("--steps") + 1])
weight = torch.zeros(1, requires_grad=True)
optimizer = torch.optim.SGD([weight], lr=0.1)
for _ in range(steps):
    loss = (weight - 3).pow(2).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"trained with torch {torch.__version__}: weight {weight.item():.2f}")
"""

TRAIN_YAML = """\
name: train
queue: default
command: [python, train.py, --steps, "50"]
resources: {gpus: 0, cpu: 1, memory: 1Gi}
"""


def _ready(base: str, make: subprocess.Popen, log: Path) -> dict:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and make.poll() is None:
        try:
            with urllib.request.urlopen(f"{base}/readyz", timeout=10) as response:
                if response.status == 200:
                    return json.loads(response.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(1)
    raise AssertionError(f"never ready:\n{log.read_text()}")


def test_a_newcomers_first_hour(tmp_path, page: Page):
    data_dir = tmp_path / "data"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        key: value for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND",
                       "OGAI_URL", "OGAI_TOKEN"}
    }
    env.update({
        "OGAI_DATA_DIR": str(data_dir), "OGAI_PORT": str(port),
        "OGAI_DEMO_PASSWORD": DEMO_PASSWORD, "VIRTUAL_ENV": sys.prefix,
        "PYTHONUNBUFFERED": "1", "OGAI_RECONCILE_INTERVAL_S": "1",
    })
    # The CLI as the newcomer runs it: its own config folder, the platform's URL from login.
    cli_env = {**env, "XDG_CONFIG_HOME": str(tmp_path / "config"), "NO_COLOR": "1",
               "COLUMNS": "200"}

    def ogai(*args: str, stdin: str | None = None, timeout: float = 120):
        done = subprocess.run([OGAI, *args], env=cli_env, input=stdin, capture_output=True,
                              text=True, timeout=timeout, cwd=tmp_path)
        return done.returncode, done.stdout, done.stderr

    log_path = tmp_path / "make-run.log"
    with log_path.open("w") as log:
        make = subprocess.Popen(
            ["make", "--no-print-directory", "run"], cwd=REPO, env=env, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        ready = _ready(base, make, log_path)
        assert ready["checks"]["database"]["ok"] and ready["checks"]["worker"]["ok"]
        assert (data_dir / "ogai.sqlite3").exists(), "the embedded default is SQLite"
        output = log_path.read_text()
        assert f"demo-admin   password: {DEMO_PASSWORD}" in output
        assert "platform admin  admin" in output

        # Sign in, in the browser, with the credentials `make run` printed.
        page.goto(f"{base}/")
        page.get_by_label("Username").fill("demo-user")
        page.get_by_label("Password").fill(DEMO_PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        expect(page).to_have_url(f"{base}/")

        # The CLI, as the README has it.
        code, out, err = ogai("login", "--url", base, "-u", "demo-user", "--password-stdin",
                              stdin=DEMO_PASSWORD + "\n")
        assert code == 0, err

        # Their own code: a train.py beside train.yaml, importing torch, run as written.
        work = tmp_path / "work"
        work.mkdir()
        (work / "train.py").write_text(TRAIN_PY)
        (work / "train.yaml").write_text(TRAIN_YAML)
        (work / ".gitignore").write_text("*.ckpt\n")
        (work / "old.ckpt").write_bytes(b"\0" * 4096)
        code, out, err = ogai("job", "submit", str(work / "train.yaml"), "--follow",
                              timeout=300)
        assert code == 0, out + err
        assert "shipped working folder" in err and "3 files" in err, err
        assert "trained with torch 2.13.0" in out and "weight 3.00" in out, out + err
        code, out, err = ogai("job", "list", "--json")
        trained = json.loads(out)[0]
        assert trained["name"] == "train" and trained["state"] == "succeeded", trained
        code, out, err = ogai("job", "files", str(trained["id"]))
        assert code == 0 and "train.py" in out and "old.ckpt" not in out, out + err
        page.goto(f"{base}/jobs/{trained['id']}/")
        expect(page.get_by_text("Working folder")).to_be_visible()

        # A job takes every core of this machine; a second deployment then waits for one.
        cores = os.cpu_count() or 1
        code, out, err = ogai("job", "submit", "-", "--no-workdir", "--quiet", stdin=json.dumps({
            "name": "hog", "queue": "default",
            "command": [sys.executable, "-c", "import time; time.sleep(900)"],
            "resources": {"gpus": 0, "cpu": cores, "memory": "256Mi"}}))
        assert code == 0, err
        hog = int(out.strip())
        deadline = time.monotonic() + 60
        while True:
            _, out, _ = ogai("job", "show", str(hog), "--json")
            if json.loads(out)["state"] == "running":
                break
            assert time.monotonic() < deadline, out
            time.sleep(1)
        tiny_model(data_dir / "imports" / "tiny")
        code, out, err = ogai("model", "import", str(data_dir / "imports" / "tiny"),
                              "--name", "tiny", "-f", timeout=180)
        assert code == 0, out + err
        with pytest.raises(subprocess.TimeoutExpired) as waited:
            ogai("deploy", "create", "second", "--version", "tiny", "--cpu", "1",
                 "--memory", "1Gi", "-w", timeout=25)
        shown = (waited.value.stdout or b"").decode() + (waited.value.stderr or b"").decode()
        why = "1 CPU core asked, 0 free on node"
        assert why in shown and f"job {hog} hog" in shown, shown
        code, out, err = ogai("deploy", "show", "second", "--json")
        deployment = json.loads(out)["deployment"]
        assert why in deployment["waiting_reason"], deployment
        page.goto(f"{base}/deployments/{deployment['id']}/")
        shown = f"starting, 0/1 replicas ready — waiting: {why} .*job {hog} hog holds"
        expect(page.get_by_text(re.compile(shown))).to_be_visible()
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends
        try:
            make.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(make.pid, signal.SIGKILL)
            raise
    # Nothing of it is left: web, worker, beat, the job and the model server.
    deadline = time.monotonic() + 20
    while processes_using(data_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_using(data_dir) == [], log_path.read_text()
    assert "OGAI stopped." in log_path.read_text()
