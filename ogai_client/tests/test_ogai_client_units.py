"""The SDK's pieces that need no server: spec parsing, the log overlap, config, usage errors."""

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ogai_client import OgaiClient, OgaiError, cli
from ogai_client.config import Config, load_config, save_config
from ogai_client.logs import LogFollower, overlap
from ogai_client.models import JobLogs, Notebook
from ogai_client.spec import SpecError, parse_memory, parse_spec

ROOT = Path(__file__).resolve().parents[2]


def test_the_library_imports_no_django():
    code = ("import ogai_client.cli, ogai_client, sys; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "{'django', 'rest_framework', 'ogai', 'infra_os', 'podsys', 'aistation'}); "
            "assert not bad, bad")
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    script = Path(sys.executable).with_name("ogai")  # the console script of `pip install -e .`
    if script.exists():
        result = subprocess.run([script, "--version"], env=env, capture_output=True, text=True,
                                timeout=60)
        assert (result.returncode, result.stdout) == (0, "ogai 0.1.0\n"), result.stderr


@pytest.mark.parametrize(("value", "mib"), [
    ("16Gi", 16384), ("512Mi", 512), ("1.5Gi", 1536), ("1Ti", 1024 * 1024), ("2048Ki", 2),
    ("1G", 954), ("100M", 96), (" 8Gi ", 8192),
])
def test_memory_quantities(value, mib):
    assert parse_memory(value) == mib


@pytest.mark.parametrize("value", ["16", "16GB", "lots", "", None, True, [1], "0Mi", "-1Gi"])
def test_bad_memory_quantities_name_the_field(value):
    with pytest.raises(SpecError, match=r"^resources\.memory"):
        parse_memory(value)


def test_a_spec_converts_memory_and_keeps_the_rest():
    spec = parse_spec("name: a\ncommand: [x]\nresources: {gpus: 1, memory: 2Gi}\n")
    assert spec == {"name": "a", "command": ["x"], "resources": {"gpus": 1, "memory_mib": 2048}}
    assert parse_spec('{"name": "a"}') == {"name": "a"}
    with pytest.raises(SpecError, match="not both"):
        parse_spec("resources: {memory: 1Gi, memory_mib: 5}")
    with pytest.raises(SpecError, match=r"not valid JSON.*line 1"):
        parse_spec('{"name": }', source="x.json")
    with pytest.raises(SpecError, match="empty"):
        parse_spec("")


@pytest.mark.parametrize(("previous", "current", "expected"), [
    ([], ["a", "b"], 0),
    (["a", "b"], ["a", "b"], 2),
    (["a", "b"], ["a", "b", "c"], 2),
    (["a", "b", "c"], ["b", "c", "d"], 2),
    (["a", "b", "c"], ["d", "e"], 0),
    (["x", "a", "x", "a"], ["x", "a", "x", "a", "y"], 4),
    (["a", "a", "b", "a"], ["a", "c"], 1),
    (["b", "a", "b"], ["a", "b", "a", "b"], 2),
])
def test_overlap(previous, current, expected):
    assert overlap(previous, current) == expected


class FakeLogs:
    """Answers like the API: the last `tail` lines of a growing log."""

    def __init__(self):
        self.lines: list[str] = []
        self.partial = ""
        self.attempt = 1

    def job_logs(self, job_id, tail=None, attempt=None, replica=None):
        text = "".join(f"{line}\n" for line in self.lines[-tail:]) + self.partial
        return JobLogs(attempt=self.attempt, replica=0, text=text)


def test_the_follower_prints_new_lines_once_holding_back_a_partial_line():
    source = FakeLogs()
    follower = LogFollower(source, 1, tail=2)
    source.lines = ["old 1", "old 2", "old 3"]
    assert follower.poll().lines == ["old 2", "old 3"]
    assert follower.poll().lines == []
    source.lines += ["same", "same"]
    source.partial = "half"
    assert follower.poll().lines == ["same", "same"]
    source.partial = ""
    source.lines.append("half done")
    assert follower.poll().lines == ["half done"]
    source.partial = "tail end"
    assert follower.poll().lines == []
    assert follower.flush() == ["tail end"]
    source.attempt, source.lines, source.partial = 2, ["new attempt"], ""
    chunk = follower.poll()
    assert chunk.new_attempt and chunk.lines == ["new attempt"]


def test_the_environment_overrides_the_config_file(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("OGAI_URL", raising=False)
    monkeypatch.delenv("OGAI_TOKEN", raising=False)
    assert load_config() == Config()
    path = save_config(Config(url="http://a", token="t1"))
    assert path == tmp_path / "ogai" / "config.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_config() == Config(url="http://a", token="t1")
    monkeypatch.setenv("OGAI_TOKEN", "t2")
    assert load_config() == Config(url="http://a", token="t2")
    monkeypatch.setenv("OGAI_URL", "http://b")
    assert load_config() == Config(url="http://b", token="t2")
    path.write_text("{not json")  # not read: the environment has both
    assert load_config() == Config(url="http://b", token="t2")


def test_a_broken_config_file_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "ogai").mkdir()
    (tmp_path / "ogai" / "config.json").write_text("[1]")
    assert cli.main(["whoami"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ogai login" in err


@pytest.mark.parametrize("argv", [
    [], ["job"], ["nope"], ["job", "show"], ["job", "show", "abc"], ["job", "logs", "1", "-x"],
    ["job", "logs", "--tail", "-3", "1"], ["queue"], ["login", "--token", "t", "-u", "me"],
])
def test_usage_errors_exit_2_with_one_line(argv, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "--help" in err


def test_help_and_version_exit_0(capsys):
    assert cli.main(["--version"]) == 0
    assert "ogai 0.1.0" in capsys.readouterr().out
    assert cli.main(["job", "logs", "--help"]) == 0
    assert "--follow" in capsys.readouterr().out


def test_an_unreachable_server_is_one_readable_line(monkeypatch, capsys, tmp_path):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setenv("OGAI_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OGAI_TOKEN", "ogai_x")
    assert cli.main(["job", "list"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot connect to http://127.0.0.1:{port}")
    assert err.count("\n") == 1


def test_a_url_without_a_scheme_is_refused(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert cli.main(["login", "--url", "localhost:8000", "--token", "x"]) == 1
    assert "http://" in capsys.readouterr().err


def _client(handler) -> OgaiClient:
    return OgaiClient("http://ogai.test/prefix", "tok", transport=httpx.MockTransport(handler))


def test_errors_come_from_the_envelope_or_say_what_answered():
    def handler(request):
        assert request.headers["Authorization"] == "Bearer tok"
        assert request.url.path.startswith("/prefix/api/v1/")
        if request.url.path.endswith("/me/"):
            return httpx.Response(502, text="<html>Bad gateway</html>")
        if request.url.path.endswith("/queues/"):
            return httpx.Response(200, text="<html>console</html>")
        return httpx.Response(403, json={"code": "permission_denied", "message": "No.",
                                         "fields": {}})

    client = _client(handler)
    with pytest.raises(OgaiError) as raised:
        client.me()
    assert raised.value.code == "http_502" and "is http://ogai.test/prefix the OGAI URL" in str(
        raised.value)
    with pytest.raises(OgaiError, match="did not answer JSON"):
        client.queues()
    with pytest.raises(OgaiError) as raised:
        client.cancel_job(3)
    assert (raised.value.code, raised.value.status, str(raised.value)) == (
        "permission_denied", 403, "No.")


def test_a_timeout_is_readable():
    def handler(request):
        raise httpx.ReadTimeout("slow", request=request)

    with pytest.raises(OgaiError) as raised:
        _client(handler).me()
    assert raised.value.code == "timeout" and "did not answer within 30 s" in str(raised.value)


def test_the_job_list_sends_repeated_states():
    seen = []

    def handler(request):
        seen.append(request.url.params.get_list("state"))
        return httpx.Response(200, json={"count": 0, "next": None, "previous": None,
                                         "results": []})

    assert _client(handler).jobs(state=["running", "queued"]) == []
    assert seen == [["running", "queued"]]


def test_json_output_is_plain_json(monkeypatch, capsys):
    def handler(request):
        return httpx.Response(200, json={"id": 1, "username": "u", "memberships": []})

    monkeypatch.setattr(cli.Context, "client", lambda self: _client(handler))
    assert cli.main(["whoami", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["username"] == "u"


class ScriptedApi:
    """A job that waits twice, then runs and prints, then succeeds: the API's answers."""

    def __init__(self):
        self.polls = 0

    def __call__(self, request):
        path = request.url.path
        if path.endswith("/logs/"):
            if self.polls < 3:
                return httpx.Response(200, json={"attempt": None, "replica": 0, "text": ""})
            lines = ["hello", "world"][: self.polls - 2]
            return httpx.Response(200, json={"attempt": 1, "replica": 0,
                                             "text": "".join(f"{x}\n" for x in lines)})
        self.polls += 1
        state = "queued" if self.polls < 3 else "running" if self.polls < 4 else "succeeded"
        return httpx.Response(200, json={"id": 7, "name": "j", "state": state,
                                         "reason": f"because {self.polls}",
                                         "attempts": [{"number": 1}] if self.polls > 2 else []})


def test_follow_on_a_terminal_shows_a_spinner_and_keeps_stdout_clean(monkeypatch, capsys):
    from io import StringIO

    from rich.console import Console

    terminal = StringIO()
    original = cli.Context.__init__

    def init(self):
        original(self)
        self.err = Console(file=terminal, force_terminal=True, width=80)

    monkeypatch.setattr(cli.Context, "__init__", init)
    monkeypatch.setattr(cli.Context, "client", lambda self: _client(ScriptedApi()))
    monkeypatch.setattr(cli, "_pause", lambda seconds: None)
    assert cli.main(["job", "logs", "-f", "7"]) == 0
    assert capsys.readouterr().out == "hello\nworld\n"
    assert "queued (because 2)" in terminal.getvalue()  # the spinner's latest status
    assert "succeeded" in terminal.getvalue()


# -- notebooks and from_env -------------------------------------------------------------------

NOTEBOOK = {"id": 4, "tenant": "alpha", "owner": "ann", "name": "explore", "queue": "default",
            "image": "", "resources": {"gpus": 1, "gpu_model": "H100", "cpu": 2.0,
                                       "memory_mib": 8192},
            "state": "running", "reason": "", "job": 17, "url": "/notebooks/4/lab",
            "gpu_hours": 1.25, "idle_timeout_s": 3600,
            "last_activity_at": "2026-01-02T03:04:05Z", "created_at": "2026-01-02T03:00:00Z"}


def test_from_env_takes_the_url_and_token_or_names_what_is_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    save_config(Config(url="http://stored", token="stored"))  # never read by from_env
    monkeypatch.delenv("OGAI_URL", raising=False)
    monkeypatch.delenv("OGAI_TOKEN", raising=False)
    with pytest.raises(OgaiError) as raised:
        OgaiClient.from_env()
    assert raised.value.code == "not_logged_in"
    assert "OGAI_URL and OGAI_TOKEN are not set" in str(raised.value)
    monkeypatch.setenv("OGAI_URL", "http://ogai.internal:8000/")
    with pytest.raises(OgaiError, match=r"^OGAI_TOKEN is not set"):
        OgaiClient.from_env()
    monkeypatch.setenv("OGAI_TOKEN", "ogai_abc")
    client = OgaiClient.from_env(timeout=5)
    assert (client.url, client.token, client.timeout) == ("http://ogai.internal:8000",
                                                          "ogai_abc", 5)
    monkeypatch.delenv("OGAI_URL")
    with pytest.raises(OgaiError, match=r"^OGAI_URL is not set"):
        OgaiClient.from_env()


def test_notebook_methods_send_what_the_api_expects_and_parse_its_answers():
    seen = []

    def handler(request):
        path = request.url.path.removeprefix("/prefix/api/v1/aistation")
        body = json.loads(request.content) if request.content else None
        seen.append((request.method, path, dict(request.url.params.multi_items()), body))
        if request.method == "DELETE":
            return httpx.Response(204)
        if request.method == "GET" and path == "/notebooks/":
            return httpx.Response(200, json={"count": 1, "next": None, "previous": None,
                                             "results": [NOTEBOOK]})
        if path.endswith("/stop/"):
            return httpx.Response(202, json={**NOTEBOOK, "state": "stopped", "url": None})
        if path.endswith("/resume/"):
            return httpx.Response(202, json={**NOTEBOOK, "state": "waiting", "url": None,
                                             "reason": "waiting: tenant quota", "job": 18})
        return httpx.Response(201 if request.method == "POST" else 200, json=NOTEBOOK)

    client = _client(handler)
    [listed] = client.list_notebooks(tenant="alpha")
    assert listed == Notebook.from_api(NOTEBOOK)
    assert (listed.id, listed.tenant, listed.owner, listed.state, listed.job) == (
        4, "alpha", "ann", "running", 17)
    assert listed.is_running and listed.url == "/notebooks/4/lab" and listed.gpu_hours == 1.25
    assert listed.resources.gpus == 1 and listed.resources.gpu_model == "H100"
    assert listed.last_activity_at is not None and listed.last_activity_at.tzinfo is not None
    started = client.start_notebook("explore", tenant="alpha", gpus=1, memory_mib=4096)
    assert started.id == 4
    stopped = client.stop_notebook(4)
    assert stopped.state == "stopped" and stopped.url is None and not stopped.is_running
    resumed = client.resume_notebook(4)
    assert (resumed.state, resumed.reason, resumed.job) == ("waiting", "waiting: tenant quota",
                                                            18)
    assert client.delete_notebook(4) is None
    assert client.notebook(4).name == "explore"
    assert seen == [
        ("GET", "/notebooks/", {"tenant": "alpha", "limit": "200", "offset": "0"}, None),
        ("POST", "/notebooks/", {}, {"name": "explore", "tenant": "alpha", "gpus": 1,
                                     "memory_mib": 4096}),
        ("POST", "/notebooks/4/stop/", {}, None),
        ("POST", "/notebooks/4/resume/", {}, None),
        ("DELETE", "/notebooks/4/", {}, None),
        ("GET", "/notebooks/4/", {}, None),
    ]


def test_a_notebook_tolerates_missing_and_new_fields():
    notebook = Notebook.from_api({"id": 1, "future": True})
    assert (notebook.state, notebook.url, notebook.job, notebook.gpu_hours) == ("", None, None,
                                                                                0.0)


def test_notebook_errors_carry_the_envelope():
    def handler(request):
        return httpx.Response(400, json={"code": "invalid", "message": "No queue 'x' in alpha.",
                                         "fields": {"queue": ["No queue 'x' in alpha."]}})

    with pytest.raises(OgaiError) as raised:
        _client(handler).start_notebook("n", queue="x")
    assert (raised.value.code, raised.value.status, raised.value.fields) == (
        "invalid", 400, {"queue": ["No queue 'x' in alpha."]})


def test_the_notebook_commands(monkeypatch, capsys):
    def handler(request):
        path = request.url.path
        if path.endswith("/notebooks/9/stop/"):
            return httpx.Response(404, json={"code": "not_found", "message": "Not found.",
                                             "fields": {}})
        if path.endswith("/stop/"):
            return httpx.Response(202, json={**NOTEBOOK, "state": "stopped", "url": None})
        if request.method == "DELETE":
            return httpx.Response(204)
        if request.method == "POST":
            assert json.loads(request.content) == {"name": "explore", "gpus": 1,
                                                   "memory_mib": 16384}
            return httpx.Response(201, json={**NOTEBOOK, "state": "waiting", "url": None,
                                             "reason": "waiting: tenant quota 8/8 GPUs"})
        return httpx.Response(200, json={"count": 1, "results": [NOTEBOOK]})

    client = _client(handler)
    monkeypatch.setattr(cli.Context, "client", lambda self: client)
    assert cli.main(["notebook", "list"]) == 0
    out = capsys.readouterr().out
    assert "explore" in out and "running" in out and "http://ogai.test/prefix/notebooks/4/lab" \
        in out
    assert cli.main(["notebook", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["id"] == 4
    assert cli.main(["notebook", "start", "explore", "--gpus", "1", "--memory", "16Gi"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("notebook 4 started: explore in alpha/default, waiting")
    assert "tenant quota" in out
    assert cli.main(["notebook", "stop", "4"]) == 0
    assert capsys.readouterr().out.startswith("notebook 4 stopped")
    assert cli.main(["notebook", "delete", "4"]) == 0
    assert capsys.readouterr().out == "notebook 4 deleted\n"
    assert cli.main(["notebook", "stop", "9"]) == 1
    err = capsys.readouterr().err
    assert err == "error: notebook 9 not found (or not visible to you)\n"


@pytest.mark.parametrize("argv", [
    ["notebook"], ["notebook", "stop"], ["notebook", "stop", "abc"], ["notebook", "start"],
    ["notebook", "start", "n", "--memory", "lots"], ["notebook", "start", "n", "--cpu", "0"],
])
def test_notebook_usage_errors_exit_2_with_one_line(argv, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "--help" in err
