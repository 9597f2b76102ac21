"""The data-pipeline runner: `python -m ylink.runners.data --spec PATH`.

Reads a document dataset (JSONL), runs the spec's steps with datatrove and writes a new dataset
version (JSONL, or token shards when the last step is `tokenize`) straight into `output_dir`.

Replicas: with WORLD_SIZE=N each replica is datatrove task RANK of N. The steps are cut into
segments at each dedup step; a segment runs on every replica over its share of the input and ends
with the dedup's signatures; the dedup's global stage (exact: find duplicates; MinHash: buckets
split over the replicas, then clustering) waits for everyone on a barrier of marker files in
`work_dir`, and the next segment starts with the dedup filter. Rank 0 merges every replica's
per-step counts and reports `data_step` events and `done`.

With `executor: ray` in the spec the runner runs once, on the head of a Ray cluster (RAY_ADDRESS;
without it, a Ray of this machine), as `ylink.runners.data_ray.RayRun`: the steps, files and
per-step records are those of N replicas, so the output and the statistics are the gang's.
`work_dir` and `output_dir` must be on storage every Ray node shares.

Datatrove's own logs go to `work_dir/attempt-N/logs/`; the job log shows only this runner's lines,
errors and the OGAI-EVENT lines.
"""

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from ylink.runners import DataError
from ylink.runners.report import Reporter
from ylink.steps import DEDUP_STEPS, EXECUTORS, StepError, validate_steps

__all__ = ["EXECUTORS", "DataError", "PeerFailed", "SpecError", "directory_content_hash",
           "load_spec", "main", "run"]

DEFAULT_BARRIER_TIMEOUT_S = 6 * 3600
OUTPUT_PATTERNS = ("*.jsonl", "*.ds", "*.ds.index", "*.ds.metadata", "*.ds.loss", "meta.json",
                   "tokenizer.json")
DROP_REASONS = {"exact_dedup": "exact_duplicate", "minhash_dedup": "near_duplicate",
                "hap": "hap"}
CHANGE_REASONS = {"normalize": "normalized", "pii": "scrubbed", "c4_lines": "lines_removed"}


class SpecError(DataError):
    """The spec or environment is wrong: every replica sees it, rank 0 reports it."""


class PeerFailed(DataError):
    """Another replica failed (it reported why)."""


def _say(rank: int, message: str) -> None:
    print(f"[ylink data r{rank}] {message}", flush=True)


# -- spec -----------------------------------------------------------------------------------
def _absolute(value: Any, place: str) -> str:
    if not isinstance(value, str) or not value:
        raise SpecError(f"{place}: required, an absolute path")
    if not os.path.isabs(value):
        raise SpecError(f"{place}: must be an absolute path, got {value!r}")
    return value


def load_spec(path: str | Path) -> dict:
    """Reads and checks a data spec; returns it with the steps' defaults filled in."""
    try:
        spec = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SpecError(f"spec file {path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise SpecError(f"spec file {path}: cannot read it as JSON ({exc})") from None
    if not isinstance(spec, dict):
        raise SpecError(f"spec file {path}: must hold a JSON object")
    source = spec.get("input")
    if not isinstance(source, dict):
        raise SpecError("input: required, an object with 'path' and 'format'")
    input_dir = _absolute(source.get("path"), "input.path")
    if source.get("format", "jsonl") != "jsonl":
        raise SpecError(f"input.format: must be 'jsonl', got {source.get('format')!r}")
    if not os.path.isdir(input_dir):
        raise SpecError(f"input.path: directory {input_dir} does not exist")
    if not any(Path(input_dir).rglob("*.jsonl")):
        raise SpecError(f"input.path: directory {input_dir} has no .jsonl files")
    output_dir = _absolute(spec.get("output_dir"), "output_dir")
    work_dir = _absolute(spec.get("work_dir"), "work_dir")
    try:
        steps = validate_steps(spec.get("steps"))
    except StepError as exc:
        raise SpecError(str(exc)) from None
    tokenizer_path = spec.get("tokenizer_path")
    if tokenizer_path is not None:
        tokenizer_path = _absolute(tokenizer_path, "tokenizer_path")
        if os.path.isdir(tokenizer_path):
            tokenizer_path = os.path.join(tokenizer_path, "tokenizer.json")
        if not os.path.isfile(tokenizer_path):
            raise SpecError(f"tokenizer_path: {tokenizer_path} does not exist")
    models = _model_paths(spec.get("models"), steps)
    timeout = spec.get("barrier_timeout_s", DEFAULT_BARRIER_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise SpecError("barrier_timeout_s: must be a positive number of seconds")
    executor = spec.get("executor") or "local"
    if executor not in EXECUTORS:
        raise SpecError(f"executor: must be 'local' (replicas, the default) or 'ray' (datatrove's "
                        f"RayPipelineExecutor on a Ray cluster), got {executor!r}")
    tasks = spec.get("tasks")
    if tasks is not None and (isinstance(tasks, bool) or not isinstance(tasks, int) or tasks < 1):
        raise SpecError(f"tasks: must be a positive integer, got {tasks!r}")
    if tasks is not None and executor != "ray":
        raise SpecError("tasks: only with executor 'ray' (replicas are the job's replica count)")
    return {
        "run": spec.get("run"),
        "input": {"path": input_dir, "format": "jsonl"},
        "output_dir": output_dir,
        "work_dir": work_dir,
        "steps": steps,
        "tokenizer_path": tokenizer_path,
        "models": models,
        "barrier_timeout_s": float(timeout),
        "executor": executor,
        "tasks": tasks,
    }


def _model_paths(models: Any, steps: list[dict]) -> dict[str, str]:
    """The local folders of the registry models the steps name (`models` in the spec maps each
    reference to its folder; the platform resolves them when the run is submitted)."""
    from ylink.runners.hap import model_references

    if models is None:
        models = {}
    if not isinstance(models, dict):
        raise SpecError("models: must be an object of model references to local folders")
    paths: dict[str, str] = {}
    for index, reference in model_references(steps):
        if reference not in models:
            raise SpecError(f"steps[{index}].params.model: the spec gives no local folder for "
                            f"{reference} (models.{reference})")
        path = _absolute(models[reference], f"models.{reference}")
        if not os.path.isdir(path):
            raise SpecError(f"models.{reference}: directory {path} does not exist")
        paths[reference] = path
    return paths


# -- work directory and barrier ---------------------------------------------------------------
class Layout:
    def __init__(self, work_dir: str, attempt: int):
        self.root = Path(work_dir) / f"attempt-{attempt}"
        self.barrier = self.root / "barrier"
        self.stats = self.root / "stats"
        self.logs = self.root / "logs"

    def docs(self, segment: int) -> Path:
        return self.root / f"segment-{segment}" / "docs"

    def dedup(self, index: int) -> Path:
        return self.root / f"dedup-{index}"


class Barrier:
    """Marker files in a shared directory. `wait(name)` returns when every rank has reached
    `name`; it stops early when another rank wrote a failure marker, and after `timeout`."""

    def __init__(self, folder: Path, rank: int, world_size: int, timeout: float):
        self.folder = folder
        self.rank = rank
        self.world_size = world_size
        self.timeout = timeout

    def _write(self, name: str, content: str = "") -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / name
        tmp = self.folder / f".{name}.tmp"
        tmp.write_text(content)
        tmp.replace(path)

    def arrive(self, name: str) -> None:
        self._write(f"{name}.{self.rank}")

    def fail(self, message: str) -> None:
        with contextlib.suppress(OSError):
            self._write(f"failed.{self.rank}", message)

    def check_peers(self) -> None:
        for path in sorted(self.folder.glob("failed.*")):
            peer = path.name.split(".", 1)[1]
            if peer != str(self.rank):
                raise PeerFailed(f"replica {peer} failed: {path.read_text().strip()}")

    def wait(self, name: str) -> None:
        self.arrive(name)
        if self.world_size == 1:
            return
        deadline = time.monotonic() + self.timeout
        pause = 0.01
        while True:
            self.check_peers()
            missing = [r for r in range(self.world_size)
                       if not (self.folder / f"{name}.{r}").exists()]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise DataError(
                    f"waited {self.timeout:.0f} s at '{name}' for replicas "
                    f"{', '.join(map(str, missing))}; giving up"
                )
            time.sleep(pause)
            pause = min(pause * 1.5, 0.2)


# -- datatrove plumbing ---------------------------------------------------------------------
def _quiet_datatrove_logging() -> None:
    """Datatrove logs every task at INFO to stderr; keep full logs in the task log files and
    only errors without tracebacks on the console (this runner prints its own lines)."""
    import datatrove.executor.base as executor_base
    from datatrove.utils.logging import logger

    level = os.environ.get("YLINK_DATATROVE_LOG_LEVEL", "ERROR")

    def console_handler() -> None:
        logger.remove()
        logger.add(sys.stderr, level=level, format="{level}: {message}",
                   filter=lambda record: record["exception"] is None)

    def add_task_logger(logging_dir, rank, local_rank=0, node_rank=-1):
        logfile = logging_dir.open(f"logs/task_{rank:05d}.log", "w")
        console_handler()
        logger.add(logfile, level="DEBUG",
                   format="{time:YYYY-MM-DD HH:mm:ss.SSS} | {level: <8} | {name}:{function}:"
                          "{line} - {message}")
        logger.info(f"Launching pipeline for {rank=}")
        return logfile

    def close_task_logger(logfile) -> None:
        logger.complete()
        console_handler()
        logfile.close()

    executor_base.add_task_logger = add_task_logger
    executor_base.close_task_logger = close_task_logger
    console_handler()


def _execute(pipeline: list, *, tasks: int, local_tasks: int, offset: int, logs: Path) -> None:
    from datatrove.executor import LocalPipelineExecutor

    LocalPipelineExecutor(
        pipeline, tasks=tasks, workers=1, local_tasks=local_tasks, local_rank_offset=offset,
        logging_dir=str(logs), skip_completed=False,
    ).run()


def _segments(steps: list[dict]) -> list[dict]:
    """Cuts the steps at each dedup: [{"before": dedup index or None, "steps": [indexes],
    "after": dedup index or None}]."""
    segments, current = [], {"before": None, "steps": []}
    for index, step in enumerate(steps):
        if step["type"] in DEDUP_STEPS:
            current["after"] = index
            segments.append(current)
            current = {"before": index, "steps": []}
        else:
            current["steps"].append(index)
    current["after"] = None
    segments.append(current)
    return segments


def _minhash_config(params: dict):
    from datatrove.pipeline.dedup.minhash import MinhashConfig

    return MinhashConfig(n_grams=params["n_grams"], num_buckets=params["num_buckets"],
                         hashes_per_bucket=params["hashes_per_bucket"], seed=params["seed"])


class Run:
    """One replica's run of a validated spec."""

    def __init__(self, spec: dict, rank: int, world_size: int, attempt: int):
        self.spec = spec
        self.steps = spec["steps"]
        self.rank = rank
        self.world_size = world_size
        self.layout = Layout(spec["work_dir"], attempt)
        self.output_dir = Path(spec["output_dir"])
        self.barrier = Barrier(self.layout.barrier, rank, world_size, spec["barrier_timeout_s"])
        self.tokenize = self.steps[-1]["type"] == "tokenize"
        self.tokenizer_path: str | None = None

    # -- pipeline building ---------------------------------------------------------------------
    def _tokenizer_file(self) -> str:
        if self.spec["tokenizer_path"]:
            return self.spec["tokenizer_path"]
        from ylink.runners.shards import byte_tokenizer

        path = self.layout.root / f"byte-tokenizer.r{self.rank}.json"
        byte_tokenizer().save(str(path))
        return str(path)

    def _check_tokenizer(self) -> None:
        from ylink.runners.shards import EOS_TOKEN, load_tokenizer

        self.tokenizer_path = self._tokenizer_file()
        try:
            tokenizer = load_tokenizer(self.tokenizer_path)
        except Exception as exc:
            raise SpecError(f"tokenizer_path: cannot load {self.tokenizer_path} ({exc})") from None
        if tokenizer.token_to_id(EOS_TOKEN) is None:
            raise SpecError(f"tokenizer_path: {self.tokenizer_path} has no {EOS_TOKEN} token")

    def _counted(self, inner, index: int, **kwargs):
        from ylink.runners.data_steps import CountedStep

        step_type = self.steps[index]["type"]
        return CountedStep(inner, index=index, step_type=step_type,
                           stats_dir=str(self.layout.stats), **kwargs)

    def _segment_pipeline(self, number: int, segment: dict) -> list:
        from datatrove.pipeline.dedup import (
            ExactDedupFilter,
            ExactDedupSignature,
            MinhashDedupFilter,
            MinhashDedupSignature,
        )

        from ylink.runners.data_steps import (
            InputReader,
            JsonlFileWriter,
            OutputStats,
            PositionRecorder,
            RankFileReader,
            build_step,
            exact_dedup_config,
            output_adapter,
        )

        stats = str(self.layout.stats)
        if number == 0:
            pipeline: list = [InputReader(self.spec["input"]["path"], stats)]
        else:
            pipeline = [RankFileReader(str(self.layout.docs(number - 1)))]
        before = segment["before"]
        if before is not None:
            kind, params = self.steps[before]["type"], self.steps[before]["params"]
            folder = self.layout.dedup(before)
            if kind == "exact_dedup":
                inner = ExactDedupFilter(str(folder / "found"), exact_dedup_config(params))
            else:
                inner = MinhashDedupFilter(str(folder / "remove"))
            pipeline.append(self._counted(inner, before, drop_reason=DROP_REASONS[kind]))
        for index in segment["steps"]:
            step = self.steps[index]
            if step["type"] == "tokenize":
                from ylink.runners.data_steps import RankSeededTokenizer
                from ylink.runners.shards import EOS_TOKEN

                pipeline.append(OutputStats(stats))
                tokenizer = RankSeededTokenizer(  # shuffles with seed + the task's rank
                    str(self.output_dir), self.tokenizer_path,
                    local_working_dir=str(self.layout.root / "tokenize"),
                    eos_token=EOS_TOKEN, shuffle_documents=step["params"]["shuffle"],
                    seed=step["params"]["seed"], batch_size=1000,
                )
                pipeline.append(self._counted(tokenizer, index, terminal=True))
                continue
            kind = step["type"]
            pipeline.append(self._counted(
                build_step(step, self.spec.get("models")), index,
                change_reason=CHANGE_REASONS.get(kind, "changed"),
                sample_after_only=kind == "pii", drop_reason=DROP_REASONS.get(kind),
            ))
        after = segment["after"]
        if after is not None:
            kind, params = self.steps[after]["type"], self.steps[after]["params"]
            folder = self.layout.dedup(after)
            if kind == "exact_dedup":
                signature = ExactDedupSignature(str(folder / "signatures"),
                                                exact_dedup_config(params))
            else:
                signature = MinhashDedupSignature(str(folder / "signatures"),
                                                  config=_minhash_config(params))
            pipeline += [
                PositionRecorder(str(folder / "positions")),
                JsonlFileWriter(str(self.layout.docs(number))),
                self._counted(signature, after, part="signature", terminal=True),
            ]
        elif not self.tokenize:
            pipeline += [
                OutputStats(stats),
                JsonlFileWriter(str(self.output_dir), adapter=output_adapter),
            ]
        return pipeline

    # -- global dedup stages -------------------------------------------------------------------
    def _timed(self, index: int, part: str, started: float) -> None:
        from ylink.runners.data_steps import write_record

        write_record(str(self.layout.stats), index, part, self.rank,
                     {"seconds": time.perf_counter() - started})

    def _global_exact(self, index: int) -> None:
        from ylink.runners.data_steps import GlobalExactFind, exact_dedup_config

        if self.rank == 0:
            started = time.perf_counter()
            folder = self.layout.dedup(index)
            find = GlobalExactFind(str(folder / "signatures"), str(folder / "found"),
                                   str(folder / "positions"),
                                   exact_dedup_config(self.steps[index]["params"]))
            _execute([find], tasks=1, local_tasks=1, offset=0,
                     logs=self.layout.logs / f"dedup-{index}-find")
            self._timed(index, "find", started)
        self.barrier.wait(f"dedup-{index}-found")

    def _global_minhash(self, index: int) -> None:
        from datatrove.pipeline.dedup import MinhashDedupBuckets

        config = _minhash_config(self.steps[index]["params"])
        folder = self.layout.dedup(index)
        buckets = config.num_buckets
        # contiguous share of the buckets for this rank (datatrove task = bucket)
        share, extra = divmod(buckets, self.world_size)
        first = self.rank * share + min(self.rank, extra)
        count = share + (1 if self.rank < extra else 0)
        if count:
            started = time.perf_counter()
            step = MinhashDedupBuckets(str(folder / "signatures"), str(folder / "buckets"),
                                       config=config)
            _execute([step], tasks=buckets, local_tasks=count, offset=first,
                     logs=self.layout.logs / f"dedup-{index}-buckets")
            self._timed(index, "buckets", started)
        self.barrier.wait(f"dedup-{index}-buckets")
        if self.rank == 0:
            self._cluster_minhash(index, folder, config)
        self.barrier.wait(f"dedup-{index}-clustered")

    def _cluster_minhash(self, index: int, folder: Path, config: Any) -> None:
        """MinHash's clustering of the buckets into what to remove: one task, in this
        process."""
        from ylink.runners.data_steps import EarliestMinhashCluster

        started = time.perf_counter()
        cluster = EarliestMinhashCluster(str(folder / "buckets"), str(folder / "remove"),
                                         str(folder / "positions"), config)
        _execute([cluster], tasks=1, local_tasks=1, offset=0,
                 logs=self.layout.logs / f"dedup-{index}-cluster")
        self._timed(index, "cluster", started)

    # -- the run -------------------------------------------------------------------------------
    def _run_segment(self, number: int, pipeline: list) -> None:
        _execute(pipeline, tasks=self.world_size, local_tasks=1, offset=self.rank,
                 logs=self.layout.logs / f"segment-{number}")

    def prepare(self) -> None:
        if self.rank == 0:
            if self.world_size == 1 and self.layout.root.exists():
                shutil.rmtree(self.layout.root)
            self.output_dir.mkdir(parents=True, exist_ok=True)
            for pattern in OUTPUT_PATTERNS:  # leftovers of an earlier attempt
                for path in self.output_dir.glob(pattern):
                    path.unlink()
        self.layout.root.mkdir(parents=True, exist_ok=True)
        if self.tokenize:
            self._check_tokenizer()
        self.barrier.wait("start")

    def discard_output(self) -> None:
        """After a failure: remove what this replica wrote to the output directory."""
        names = [f"{self.rank:05d}*"] + (["meta.json", "tokenizer.json"] if self.rank == 0 else [])
        for pattern in names:
            for path in self.output_dir.glob(pattern):
                with contextlib.suppress(OSError):
                    path.unlink()

    def close(self) -> None:
        """Release what the run holds beyond its files (nothing, for a replica)."""

    def execute(self) -> None:
        started = time.perf_counter()
        segments = _segments(self.steps)
        for number, segment in enumerate(segments):
            t0 = time.perf_counter()
            self._run_segment(number, self._segment_pipeline(number, segment))
            names = [self.steps[i]["type"] for i in segment["steps"]]
            if segment["before"] is not None:
                names.insert(0, f"{self.steps[segment['before']]['type']} (filter)")
            if segment["after"] is not None:
                names.append(f"{self.steps[segment['after']]['type']} (signatures)")
            _say(self.rank, f"segment {number + 1}/{len(segments)}: {', '.join(names) or 'copy'}"
                            f" done in {time.perf_counter() - t0:.1f} s")
            after = segment["after"]
            if after is None:
                continue
            self.barrier.wait(f"segment-{number}")
            t0 = time.perf_counter()
            if self.steps[after]["type"] == "exact_dedup":
                self._global_exact(after)
            else:
                self._global_minhash(after)
            _say(self.rank, f"{self.steps[after]['type']}: global stage done in "
                            f"{time.perf_counter() - t0:.1f} s")
        self.seconds = time.perf_counter() - started

    def finish(self, reporter: Reporter) -> dict | None:
        """Every rank signals it is done; rank 0 waits for all, merges and reports."""
        self.barrier.arrive("done")
        if self.rank != 0:
            return None
        self.barrier.wait("done")
        records = _read_records(self.layout.stats)
        steps = merge_step_records(self.steps, records)
        for step in steps:
            reporter.send("data_step", **step)
        output = self._output_summary(records, steps)
        reporter.send("done", output=output)
        return output

    def _output_summary(self, records: dict, steps: list[dict]) -> dict:
        from ylink.runners.data_steps import OutputStats

        inputs = records.get(("input", "main"), [])
        outputs = records.get(("output", "main"), [])
        histogram = [sum(column) for column in zip(*(r["histogram"] for r in outputs),
                                                   strict=True)] if outputs else []
        stats: dict[str, Any] = {
            "input_documents": sum(r["documents"] for r in inputs),
            "input_bytes": sum(r["bytes"] for r in inputs),
            "skipped_empty": sum(r["skipped_empty"] for r in inputs),
            "input_files": inputs[0]["files"] if inputs else 0,
            "text_bytes": sum(r["bytes"] for r in outputs),
            "length_histogram": {"edges": OutputStats.EDGES, "counts": histogram},
            "world_size": self.world_size,
            "executor": self.spec["executor"],
            "seconds": round(self.seconds, 3),
            "steps": [{k: v for k, v in step.items() if k != "samples"} for step in steps],
        }
        documents = sum(r["documents"] for r in outputs)
        summary: dict[str, Any] = {"path": str(self.output_dir),
                                   "format": "tokens" if self.tokenize else "jsonl"}
        if self.tokenize:
            summary.update(self._write_token_meta())
            documents = summary.pop("documents")
        summary["documents"] = documents
        summary["bytes"] = sum(p.stat().st_size for p in self.output_dir.iterdir() if p.is_file())
        summary["content_hash"] = directory_content_hash(self.output_dir)
        summary["stats"] = stats
        return summary

    def _write_token_meta(self) -> dict:
        import numpy as np

        from ylink.runners.shards import EOS_TOKEN, load_tokenizer

        tokenizer = load_tokenizer(self.tokenizer_path)
        shutil.copyfile(self.tokenizer_path, self.output_dir / "tokenizer.json")
        documents = tokens = 0
        for index in sorted(self.output_dir.glob("*.ds.index")):
            ends = np.fromfile(index, dtype="<u8")
            documents += len(ends)
            tokens += int(ends[-1]) if len(ends) else 0
        vocab_size = tokenizer.get_vocab_size()
        meta = {
            "seq_len": self.steps[-1]["params"]["seq_len"],
            "eos_id": tokenizer.token_to_id(EOS_TOKEN),
            "vocab_size": vocab_size,
            "token_size": 4 if vocab_size > 65536 else 2,
            "documents": documents,
            "tokens": tokens,
            "tokenizer": "given" if self.spec["tokenizer_path"] else "bytes",
        }
        (self.output_dir / "meta.json").write_text(json.dumps(meta, indent=1))
        return {"documents": documents, "tokens": tokens}


def _read_records(folder: Path) -> dict[tuple[str, str], list[dict]]:
    records: dict[tuple[str, str], list[dict]] = {}
    for path in sorted(folder.glob("step-*.json")):
        index, part, _ = path.name[len("step-"):].split(".", 2)
        records.setdefault((index, part), []).append(json.loads(path.read_text()))
    return records


def _pick_samples(samples: list[dict], dropped: dict[str, int], limit: int = 5) -> list[dict]:
    """Up to `limit` samples, taking turns over reasons (most frequent drop reasons first)."""
    by_reason: dict[str, list[dict]] = {}
    for item in samples:
        by_reason.setdefault(item["reason"], []).append(item)
    order = sorted(by_reason, key=lambda reason: (-dropped.get(reason, 0), reason))
    picked: list[dict] = []
    while len(picked) < limit and any(by_reason.values()):
        for reason in order:
            if by_reason[reason] and len(picked) < limit:
                picked.append(by_reason[reason].pop(0))
    return picked


def merge_step_records(steps: list[dict], records: dict) -> list[dict]:
    """One `data_step` payload per step, summed over replicas; seconds = for each part of the
    step (signatures, global stages, the step itself) the slowest replica, added up."""
    merged = []
    for index, step in enumerate(steps):
        main = records.get((str(index), "main"), [])
        dropped: dict[str, int] = {}
        for record in main:
            for reason, count in record["dropped"].items():
                dropped[reason] = dropped.get(reason, 0) + count
        seconds = sum(
            max(r["seconds"] for r in parts)
            for (key, _part), parts in records.items() if key == str(index)
        )
        merged.append({
            "index": index,
            "type": step["type"],
            "docs_in": sum(r["docs_in"] for r in main),
            "docs_out": sum(r["docs_out"] for r in main),
            "bytes_in": sum(r["bytes_in"] for r in main),
            "bytes_out": sum(r["bytes_out"] for r in main),
            "changed": sum(r["changed"] for r in main),
            "dropped": dict(sorted(dropped.items(), key=lambda item: -item[1])),
            "samples": _pick_samples([s for r in main for s in r["samples"]], dropped),
            "seconds": round(seconds, 3),
        })
    return merged


def directory_content_hash(directory: str | Path) -> str:
    """sha256 over the files of a directory (relative path and content, in path order)."""
    directory = Path(directory)
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(path.relative_to(directory).as_posix().encode() + b"\0")
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
        digest.update(b"\0")
    return "sha256:" + digest.hexdigest()


def _environment() -> tuple[int, int, int]:
    def number(name: str, default: int) -> int:
        value = os.environ.get(name, "")
        try:
            return int(value) if value.strip() else default
        except ValueError:
            raise SpecError(f"environment: {name} must be an integer, got {value!r}") from None

    rank, world_size = number("RANK", 0), number("WORLD_SIZE", 1)
    if world_size < 1 or not 0 <= rank < world_size:
        raise SpecError(f"environment: RANK={rank} WORLD_SIZE={world_size} is not a valid rank")
    return rank, world_size, number("OGAI_ATTEMPT", 1)


def run(spec_path: str | Path, *, reporter: Reporter | None = None) -> dict | None:
    """Runs this replica (RANK/WORLD_SIZE from the environment); returns the `done` output on
    rank 0. Raises DataError (PeerFailed when another replica failed)."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may be downloaded at run time
    os.environ.setdefault("TQDM_DISABLE", "1")
    rank, world_size, attempt = _environment()
    reporter = reporter or Reporter(enabled=rank == 0)
    reporter.send("started", attempt=attempt, world_size=world_size, resumed_from_step=None)
    spec = load_spec(spec_path)
    _quiet_datatrove_logging()
    if spec["executor"] == "ray":
        from ylink.runners.data_ray import RayRun

        job: Run = RayRun(spec, attempt)
    else:
        job = Run(spec, rank, world_size, attempt)
    try:
        job.prepare()
        job.execute()
        return job.finish(reporter)
    except BaseException as exc:  # tell the other replicas, then let main() report it
        if not isinstance(exc, PeerFailed):
            message = str(exc) if isinstance(exc, DataError) else f"{type(exc).__name__}: {exc}"
            job.barrier.fail(" ".join(message.split()))
        job.discard_output()
        raise
    finally:
        job.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ylink.runners.data",
                                     description="Run a YLink data pipeline.")
    parser.add_argument("--spec", required=True, help="path of the data spec (JSON)")
    args = parser.parse_args(argv)
    try:
        rank = int(os.environ.get("RANK", "0") or 0)
    except ValueError:
        rank = 0
    reporter = Reporter.from_env(enabled=rank == 0)
    try:
        output = run(args.spec, reporter=reporter)
    except Exception as exc:
        if isinstance(exc, DataError):
            message = str(exc)
        else:
            traceback.print_exc()
            message = f"{type(exc).__name__}: {exc}"
        message = " ".join(message.split())
        # Every replica sees a bad spec: rank 0 reports it. Another replica's failure was
        # reported by that replica. Anything else is reported by the replica it happened on.
        if not isinstance(exc, PeerFailed) and (rank == 0 or not isinstance(exc, SpecError)):
            failing = reporter if rank == 0 else Reporter.from_env(enabled=True)
            failing.send("failed", message=message)
            if failing is not reporter:
                failing.close(timeout=30)
        reporter.close(timeout=30)
        print(f"error: {message}", file=sys.stderr, flush=True)
        return 1
    if output is not None:
        _say(0, f"done: {output['documents']} documents, {output['bytes']} bytes in "
                f"{output['path']}")
    reporter.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
