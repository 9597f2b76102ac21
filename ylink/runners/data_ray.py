"""`executor: ray`: the data runner's whole run from one process on a Ray cluster.

The run holds one actor per task slot (a CPU of the cluster, or the spec's `tasks` if fewer), in
one placement group, for its whole length. Each segment, and MinHash's bucket stage, is a
datatrove RayPipelineExecutor of N tasks whose ranks the actors run in their own processes
through the executor's `_run_for_rank` (datatrove's per-task path: its task log, stats and
completion marker). Not datatrove's own `run()`: it starts new actors and a placement group per
task at every stage (seconds each) and forks a process pool inside each actor, and a fork of
Ray's multithreaded worker can deadlock. This process runs the one-task global stages as rank 0
of a gang does and is the gang's barrier, so the files and per-step records are those of N
replicas.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from ylink.runners import DataError
from ylink.runners.data import OUTPUT_PATTERNS, Barrier, Run, SpecError, _minhash_config

_LOG_ERROR = re.compile(r"\| ERROR\s+\| [^ ]+ - (.*)$")


class RankWorker:
    """A Ray actor: runs its share of a stage's ranks one after another, in its own process."""

    def run(self, executor: Any, ranks: list[int]) -> list[int]:
        """The ranks that raised (datatrove logged why in their task logs)."""
        failed = []
        for rank in ranks:
            try:
                executor._run_for_rank(rank, 1)  # local rank 1: the task log, not the console
            except Exception:
                failed.append(rank)
        return failed


class RayRun(Run):
    """Task RANK of N here is exactly replica RANK of N replicas: same files and per-step
    records, so `finish` merges and reports as rank 0 of a gang does."""

    def __init__(self, spec: dict, attempt: int):
        self.owns_ray = connect_ray()
        self.group: Any = None
        self.workers: list[Any] = []
        try:
            slots = ray_task_slots()
            tasks = spec["tasks"] or slots
            super().__init__(spec, 0, tasks, attempt)
            self.group, self.workers = start_workers(min(tasks, slots),
                                                     spec["barrier_timeout_s"])
        except BaseException:
            self.close()
            raise
        # one process: the barrier never waits for peers
        self.barrier = Barrier(self.layout.barrier, 0, 1, spec["barrier_timeout_s"])

    def close(self) -> None:
        import ray

        for worker in self.workers:
            with contextlib.suppress(Exception):
                ray.kill(worker)
        self.workers = []
        if self.group is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):
                remove_placement_group(self.group)
            self.group = None
        if self.owns_ray:
            ray.shutdown()
            self.owns_ray = False

    def _ray_execute(self, pipeline: list, *, tasks: int, logs: Path) -> None:
        import ray
        from datatrove.executor.ray import RayPipelineExecutor
        from ray.exceptions import RayActorError

        executor = RayPipelineExecutor(pipeline, tasks=tasks, logging_dir=str(logs),
                                       skip_completed=False, cpus_per_task=1, mem_per_cpu_gb=0)
        executor.save_executor_as_json()
        shared = ray.put(executor)
        count = len(self.workers)
        calls = [worker.run.remote(shared, list(range(index, tasks, count)))
                 for index, worker in enumerate(self.workers) if index < tasks]
        timeout = self.spec["barrier_timeout_s"]
        done, waiting = ray.wait(calls, num_returns=len(calls), timeout=timeout)
        if waiting:
            raise DataError(f"Ray stage {logs.name} did not end in {timeout:.0f} s; giving up")
        try:
            ray.get(done)
        except RayActorError as exc:
            raise DataError(f"Ray stage {logs.name}: a worker died "
                            f"({' '.join(str(exc).split())[:300]})") from None
        missing = executor.get_incomplete_ranks(range(tasks), skip_completed=True)
        if missing:
            raise DataError(_task_failure(logs, missing, tasks))

    def _run_segment(self, number: int, pipeline: list) -> None:
        self._ray_execute(pipeline, tasks=self.world_size,
                          logs=self.layout.logs / f"segment-{number}")

    # The one-task global stages (exact dedup's find, MinHash's clustering) run in this process,
    # as on rank 0 of a gang: they are light and sequential.

    def _global_minhash(self, index: int) -> None:
        from datatrove.pipeline.dedup import MinhashDedupBuckets

        from ylink.runners.data_steps import BucketShare

        config = _minhash_config(self.steps[index]["params"])
        folder = self.layout.dedup(index)
        started = time.perf_counter()
        step = MinhashDedupBuckets(str(folder / "signatures"), str(folder / "buckets"),
                                   config=config)
        # one Ray task per worker, each a contiguous share of the buckets (as the replicas)
        self._ray_execute([BucketShare(step, config.num_buckets)], tasks=self.world_size,
                          logs=self.layout.logs / f"dedup-{index}-buckets")
        self._timed(index, "buckets", started)
        self._cluster_minhash(index, folder, config)

    def prepare(self) -> None:
        if self.layout.root.exists():  # this process alone writes the attempt's folder
            shutil.rmtree(self.layout.root)
        super().prepare()

    def discard_output(self) -> None:
        for pattern in OUTPUT_PATTERNS:
            for path in self.output_dir.glob(pattern):
                with contextlib.suppress(OSError):
                    path.unlink()


def connect_ray() -> bool:
    """Joins the Ray cluster at RAY_ADDRESS (a Ray cluster job sets it), or starts a Ray of this
    machine without it; returns whether this process started Ray (and must stop it)."""
    try:
        import ray
    except ImportError:
        raise SpecError("executor: 'ray' needs ray installed in the job's environment "
                        "(pip install 'ogai[ray]')") from None
    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS") or None
    options: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
    if address is None:
        options["include_dashboard"] = False
    try:
        ray.init(address=address, **options)
    except Exception as exc:
        raise DataError(f"executor ray: cannot join the Ray cluster at "
                        f"{address or 'this machine'} ({type(exc).__name__}: {exc})") from None
    return True


def ray_task_slots() -> int:
    """Tasks of a Ray run when the spec does not say: one per CPU of the cluster."""
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def start_workers(count: int, timeout: float) -> tuple[Any, list[Any]]:
    """A placement group of `count` CPUs, all or none (two runs sharing a cluster never hold
    half of it each, waiting for the other), and a rank worker on each; started now, so their
    start-up (a second or more each) is paid once per run, not once per stage."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = placement_group([{"CPU": 1}] * count)
    ready, _ = ray.wait([group.ready()], timeout=timeout)
    if not ready:
        remove_placement_group(group)
        raise DataError(f"executor ray: the Ray cluster had no room for {count} workers of 1 CPU "
                        f"in {timeout:.0f} s")
    actor = ray.remote(RankWorker)
    workers = [actor.options(num_cpus=1, scheduling_strategy=PlacementGroupSchedulingStrategy(
        group, placement_group_bundle_index=index)).remote() for index in range(count)]
    return group, workers


def _task_failure(logs: Path, missing: list[int], tasks: int) -> str:
    """Why a Ray stage failed, from the first failed task's datatrove log (the error line its
    exception was logged with)."""
    for rank in missing:
        path = logs / "logs" / f"task_{rank:05d}.log"
        with contextlib.suppress(OSError):
            errors = [m.group(1) for line in path.read_text(errors="replace").splitlines()
                      if (m := _LOG_ERROR.search(line))]
            if errors:
                return errors[-1].strip()
    return (f"Ray tasks {', '.join(map(str, missing))} of {tasks} did not complete; "
            f"see {logs / 'logs'}")
