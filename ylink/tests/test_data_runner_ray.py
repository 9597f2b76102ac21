"""`executor: ray`: the data runner's steps through datatrove's RayPipelineExecutor on a Ray of
this machine (2 CPUs) give the same files, documents and per-step statistics as 2 replicas."""

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ylink.runners.data import SpecError, load_spec
from ylink.runners.report import Reporter
from ylink.runners.samples import synthetic_corpus, write_corpus
from ylink.tests.test_data_runner import PIPELINE, ROOT, events, read_output, runner_env

ray = pytest.importorskip("ray")

TIMEOUT = 420  # two Ray actors start per stage: seconds each on a busy 2-core machine


def write_spec(path: Path, input_dir: Path, name: str, steps, **extra) -> Path:
    base = path.parent
    path.write_text(json.dumps({
        "run": 1, "input": {"path": str(input_dir), "format": "jsonl"},
        "output_dir": str(base / f"out-{name}"), "work_dir": str(base / f"work-{name}"),
        "steps": steps, **extra,
    }))
    return path


@pytest.fixture(scope="module")
def local_ray():
    """A Ray of this machine with 2 CPUs (2 workers), started by this test process."""
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    if started:
        ray.shutdown()


def start(spec: Path, name: str, **env) -> tuple[subprocess.Popen, Path]:
    """The runner in a process of its own, its output in files (several run at once)."""
    log = spec.parent / f"{name}.log"
    with open(log.with_suffix(".out"), "w") as out, open(log, "w") as err:
        process = subprocess.Popen([sys.executable, "-m", "ylink.runners.data", "--spec",
                                    str(spec)], cwd=ROOT, env=runner_env(**env), stdout=out,
                                   stderr=err, text=True)
    return process, log


def finish(process: subprocess.Popen, log: Path) -> str:
    try:
        code = process.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        code = "timed out"
    assert code == 0, f"{log.stem}: {code}: {log.read_text()[-3000:]}"
    return log.with_suffix(".out").read_text()


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def comparable(stdout: str) -> tuple[list[dict], dict]:
    """The data_step events without their seconds, and the done output without timings."""
    all_events = events(stdout)
    assert all_events[0]["kind"] == "started" and all_events[-1]["kind"] == "done"
    steps = [{k: v for k, v in e["data"].items() if k != "seconds"}
             for e in all_events if e["kind"] == "data_step"]
    output = dict(all_events[-1]["data"]["output"])
    stats = {k: v for k, v in output.pop("stats").items() if k not in {"seconds", "executor"}}
    stats["steps"] = [{k: v for k, v in s.items() if k != "seconds"} for s in stats["steps"]]
    output.pop("path")
    return steps, {**output, "stats": stats}


@pytest.fixture(scope="module")
def gang_and_ray(tmp_path_factory, local_ray):
    """One corpus through the cleaning pipeline and through a shuffled tokenize, each run by 2
    replicas and by the runner alone with `executor: ray` joining the Ray at RAY_ADDRESS (as
    the entrypoint of a Ray cluster job does), all at once."""
    base = tmp_path_factory.mktemp("ray")
    records = synthetic_corpus(150, seed=7, exact_dups=12, near_dups=24, pii=12, junk=15,
                               js_lines=6)
    write_corpus(records, base / "input", files=3)
    tokenize = [{"type": "normalize"}, {"type": "tokenize", "params": {"seq_len": 64}}]
    specs = {
        "gang": write_spec(base / "gang.json", base / "input", "gang", PIPELINE),
        "ray": write_spec(base / "ray.json", base / "input", "ray", PIPELINE, executor="ray"),
        "gang-tok": write_spec(base / "gang-tok.json", base / "input", "gang-tok", tokenize),
        "ray-tok": write_spec(base / "ray-tok.json", base / "input", "ray-tok", tokenize,
                              executor="ray", tasks=2),
    }
    processes = {
        "ray": [start(specs["ray"], "ray", RAY_ADDRESS=local_ray)],
        "gang": [start(specs["gang"], f"gang-{r}", RANK=str(r), WORLD_SIZE="2")
                 for r in range(2)],
        "ray-tok": [start(specs["ray-tok"], "ray-tok", RAY_ADDRESS=local_ray)],
        "gang-tok": [start(specs["gang-tok"], f"gang-tok-{r}", RANK=str(r), WORLD_SIZE="2")
                     for r in range(2)],
    }
    results = {}
    for name, group in processes.items():
        stdouts = [finish(*started) for started in group]  # every replica must succeed
        results[name] = stdouts[0]  # rank 0 reports
    return {"base": base, "stdout": results}


def test_ray_executor_equals_the_replicas_document_for_document(gang_and_ray):
    base = gang_and_ray["base"]
    gang, on_ray = files(base / "out-gang"), files(base / "out-ray")
    # the Ray cluster's 2 CPUs make 2 tasks: the same files (one per task), byte for byte, so
    # the same documents in the same order within each file
    assert list(on_ray) == list(gang) == ["00000.jsonl", "00001.jsonl"]
    for name in gang:
        assert on_ray[name].splitlines() == gang[name].splitlines(), name
    assert read_output(base / "out-ray") == read_output(base / "out-gang")
    assert len(read_output(base / "out-ray")) > 100


def test_ray_executor_reports_the_same_step_statistics(gang_and_ray):
    stdout = gang_and_ray["stdout"]
    gang_steps, gang_output = comparable(stdout["gang"])
    ray_steps, ray_output = comparable(stdout["ray"])
    assert [s["type"] for s in ray_steps] == [s["type"] for s in PIPELINE]
    assert ray_steps == gang_steps  # counts, drop reasons, bytes and samples
    assert ray_output == gang_output  # documents, bytes, content hash, histogram, world size
    assert ray_output["stats"]["world_size"] == 2
    assert events(stdout["ray"])[-1]["data"]["output"]["stats"]["executor"] == "ray"
    assert events(stdout["gang"])[-1]["data"]["output"]["stats"]["executor"] == "local"


def test_ray_executor_tokenizes_and_shuffles_as_the_replicas(gang_and_ray):
    base, stdout = gang_and_ray["base"], gang_and_ray["stdout"]
    gang, on_ray = files(base / "out-gang-tok"), files(base / "out-ray-tok")
    assert any(name.endswith(".ds") for name in gang)
    # datatrove's .ds.metadata names the tokenizer file it used (in each run's own work_dir)
    for name in gang:
        if name.endswith(".ds.metadata"):
            gang[name], on_ray[name] = (content.split(b"|", 1)[1]
                                        for content in (gang[name], on_ray[name]))
    assert on_ray == gang  # shards shuffled with the same seed per task, meta.json, tokenizer
    unpathed = [comparable(stdout[name]) for name in ("ray-tok", "gang-tok")]
    for _steps, output in unpathed:
        del output["bytes"], output["content_hash"]  # that path again
    assert unpathed[0] == unpathed[1]


def test_a_failed_ray_task_fails_the_run_with_its_error_and_leaves_no_output(
        tmp_path, local_ray, monkeypatch):
    from ylink.runners import DataError, data

    for name in ("RANK", "WORLD_SIZE", "OGAI_ATTEMPT"):
        monkeypatch.delenv(name, raising=False)
    records = [{"id": str(i), "text": t["text"]} for i, t in enumerate(synthetic_corpus(8))]
    paths = write_corpus(records, tmp_path / "in", files=2)
    lines = paths[1].read_text().splitlines()
    lines.insert(2, '{"id": "broken", "text": "unterminated')
    paths[1].write_text("\n".join(lines) + "\n")
    spec = write_spec(tmp_path / "spec.json", tmp_path / "in", "bad",
                      [{"type": "normalize"}, {"type": "exact_dedup"}], executor="ray")
    out = io.StringIO()
    with pytest.raises(DataError) as failure:
        data.run(spec, reporter=Reporter(stdout=out))
    # task 1 read the broken file; its error is the run's, as replica 1's would be
    assert str(failure.value).startswith(f"{paths[1]}: line 3: not valid JSON")
    assert [e["kind"] for e in events(out.getvalue())] == ["started"]
    assert list((tmp_path / "out-bad").iterdir()) == []  # task 0's file is gone too
    assert ray.is_initialized()  # the runner leaves a Ray it did not start running


@pytest.mark.parametrize(("extra", "message"), [
    ({"executor": "spark"}, "executor: must be 'local' (replicas, the default) or 'ray' "
                            "(datatrove's RayPipelineExecutor on a Ray cluster), got 'spark'"),
    ({"executor": "ray", "tasks": 0}, "tasks: must be a positive integer, got 0"),
    ({"executor": "ray", "tasks": True}, "tasks: must be a positive integer, got True"),
    ({"tasks": 2}, "tasks: only with executor 'ray' (replicas are the job's replica count)"),
])
def test_executor_and_tasks_are_checked(tmp_path, extra, message):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"text": "hello"}\n')
    spec = write_spec(tmp_path / "spec.json", tmp_path / "in", "x", [{"type": "normalize"}],
                      **extra)
    with pytest.raises(SpecError) as error:
        load_spec(spec)
    assert str(error.value) == message


def test_executor_defaults_to_local(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"text": "hello"}\n')
    spec = load_spec(write_spec(tmp_path / "spec.json", tmp_path / "in", "x",
                                [{"type": "normalize"}]))
    assert (spec["executor"], spec["tasks"]) == ("local", None)
    spec = load_spec(write_spec(tmp_path / "spec.json", tmp_path / "in", "x",
                                [{"type": "normalize"}], executor="ray", tasks=3))
    assert (spec["executor"], spec["tasks"]) == ("ray", 3)


@pytest.mark.django_db
def test_a_ray_pipeline_run_is_a_ray_cluster_job_whose_head_runs_the_runner(
        api, farm, make_version):
    from aistation.models import Job

    version = make_version()
    client = api.as_user(farm.world.alpha_member)
    response = client.post("/api/v1/ylink/pipeline-runs/", {
        "dataset_version": version.pk, "tenant": "alpha", "replicas": 2, "executor": "ray",
        "steps": [{"type": "normalize"}, {"type": "exact_dedup"}],
        "resources": {"cpu": 2, "memory_mib": 4096}}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["replicas"], body["executor"]) == (2, "ray")
    job = Job.objects.get(pk=body["job"])
    node = {"gpus": 0, "gpu_model": "", "cpu": 2.0, "memory_mib": 4096}
    assert job.ray == {"workers": 2, "head": node, "worker": node, "dashboard": False}
    assert job.replicas == 3  # the head and 2 workers
    assert job.command[1:3] == ["-m", "ylink.runners.data"]  # the head's entrypoint
    spec = json.loads(Path(job.command[-1]).read_text())
    assert (spec["executor"], spec["tasks"]) == ("ray", 2)  # 2 tasks: 2 replicas' output
    shown = client.get(f"/api/v1/aistation/jobs/{job.pk}/").json()
    assert shown["kind"] == "ray"

    plain = client.post("/api/v1/ylink/pipeline-runs/", {
        "dataset_version": version.pk, "tenant": "alpha", "replicas": 2,
        "steps": [{"type": "normalize"}]}, format="json").json()
    assert plain["executor"] == "local"
    job = Job.objects.get(pk=plain["job"])
    assert job.ray is None and job.replicas == 2
    assert "executor" not in json.loads(Path(job.command[-1]).read_text())


@pytest.mark.django_db
def test_an_unknown_executor_is_a_400(api, farm, make_version):
    version = make_version()
    client = api.as_user(farm.world.alpha_member)
    response = client.post("/api/v1/ylink/pipeline-runs/", {
        "dataset_version": version.pk, "tenant": "alpha", "executor": "spark",
        "steps": [{"type": "normalize"}]}, format="json")
    assert response.status_code == 400
    assert "executor" in response.json()["fields"]
