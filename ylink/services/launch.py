"""Starting a toolchain runner as an AIStation job: its spec on disk, its job token in the
job's secret environment, the job itself."""

import json
import sys
from pathlib import Path

from django.conf import settings

from aistation.labels import OWNER_LABEL
from aistation.models import Job, Queue
from aistation.services.job_tokens import job_token_bind, job_token_new
from aistation.services.jobs import job_submit
from podsys.drivers.base import DataMount
from ylink import storage
from ylink.models.runs import ToolchainRun


def runner_command(module: str, spec_path: str, *, local: bool) -> list[str]:
    # The local driver runs the platform's own interpreter; a container has its own python.
    python = sys.executable if local else "python"
    return [python, "-m", module, "--spec", spec_path]


def run_display(run: ToolchainRun, kind: str) -> str:
    """How a wait names the run's job: "training run 5 tiny-gpt"."""
    what = kind.removesuffix("-runs").replace("-", " ")
    return f"{what} run {run.pk}" + (f" {run.name}" if run.name else "")


def run_launch(*, actor, run: ToolchainRun, kind: str, module: str, spec: dict, queue: Queue,
               replicas: int = 1, gpus: int = 0, gpu_model: str = "", cpu: float = 1.0,
               memory_mib: int = 2048, max_restarts: int = 2,
               reads: tuple[str | None, ...] = (), ray: dict | None = None) -> Job:
    """Write the run's spec into its folder and submit the job that runs it. Called inside
    the transaction that created the run (it needs the run's id). The job sees its run folder
    and the folders in `reads` (read-only), nothing else of the data directory. `ray` makes the
    job a Ray cluster (aistation's `kind: ray`) whose head runs the runner."""
    folder = storage.run_folder(kind, run.pk, run.created_at)
    folder.mkdir(parents=True, exist_ok=True)
    spec = {**spec, "run": run.pk}
    spec_path = folder / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=2))
    secret = job_token_new()
    job = job_submit(
        actor=actor, tenant=run.tenant, queue=queue, name=f"{kind}-{run.pk}",
        command=runner_command(module, str(spec_path),
                               local=queue.cluster.driver == "local"),
        env={"OGAI_URL": settings.OGAI_INTERNAL_URL, "HF_HUB_OFFLINE": "1",
             "TOKENIZERS_PARALLELISM": "false",
             # A CUDA image shows every GPU of the node unless told otherwise.
             **({} if gpus else {"CUDA_VISIBLE_DEVICES": ""})},
        secret_env={"OGAI_RUN_TOKEN": secret},
        replicas=replicas, gpus_per_replica=gpus, gpu_model=gpu_model, cpu_per_replica=cpu,
        memory_mib_per_replica=memory_mib, max_restarts=max_restarts,
        mounts=[DataMount(str(folder), read_only=False),
                *(DataMount(str(Path(path)), read_only=True) for path in dict.fromkeys(reads)
                  if path)],
        labels={OWNER_LABEL: run_display(run, kind)}, ray=ray,
    )
    job_token_bind(job=job, secret=secret)
    run.job = job
    run.folder = storage.relative(folder)
    run.save(update_fields=["job", "folder", "updated_at"])
    return job
