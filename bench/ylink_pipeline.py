"""YLink data pipeline throughput: the platform's runner against plain datatrove, and 1 → 2
replicas.

On one generated corpus (English-like text with planted duplicates, PII and junk; or --corpus DIR
of JSONL files), one after the other:
  (a) the platform's runner, `python -m ylink.runners.data --spec ...`, 1 replica;
  (b) the same steps built directly with plain datatrove in one process, 1 task, the same stages
      (filters → exact dedup → MinHash dedup → tokenize) and the same intermediate files;
  (c) the runner with 2 replicas (two processes, RANK=0/1, WORLD_SIZE=2, started together);
  (d) the runner once with `executor: ray` (2 tasks of datatrove's RayPipelineExecutor) on a Ray
      cluster of this machine with 2 workers of 1 CPU and a head with none (which runs the
      runner), as a `kind: ray` job has.
Each is timed as the wall time of its processes (start-up included). The Ray cluster's own
start-up is timed apart: `ray_s` excludes it (the cluster is up, as when a job's entrypoint
starts), `ray_with_startup_s` adds it. Prints documents/s and MB/s for each and, on the last line,
one JSON object.

Targets (issue 6): overhead = platform time / datatrove time - 1 at most 0.10; 2 replicas at
least 1.7x one. Issue 26: ray_vs_gang = Ray time / 2-replica time at most 1.15.
"""

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def make_corpus(directory: Path, clean: int, files: int, seed: int = 0) -> None:
    from ylink.runners.samples import synthetic_corpus

    records = synthetic_corpus(clean, seed=seed, exact_dups=clean * 3 // 100,
                               near_dups=clean * 5 // 100, pii=clean * 2 // 100,
                               junk=clean * 3 // 100, js_lines=clean // 100)
    random.Random(seed).shuffle(records)  # noqa: S311 - benchmark data
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        with open(directory / f"part-{i:03d}.jsonl", "w") as handle:
            for record in records[i::files]:
                handle.write(json.dumps(record) + "\n")


def corpus_size(directory: Path) -> tuple[int, int]:
    documents = size = 0
    for path in sorted(directory.rglob("*.jsonl")):
        size += path.stat().st_size
        with open(path, "rb") as handle:
            documents += sum(1 for line in handle if line.strip())
    return documents, size


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in {"OGAI_URL", "OGAI_RUN_TOKEN", "RANK", "WORLD_SIZE", "OGAI_ATTEMPT"}}
    env.update(extra)
    return env


def timed(commands: list[tuple[list[str], dict]], log: Path) -> tuple[float, float]:
    """Starts the commands together; returns (wall time until the last one ends, CPU seconds
    of them and their children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    processes = []
    for i, (command, env) in enumerate(commands):
        out = open(log.with_suffix(f".{i}.log"), "w")  # noqa: SIM115 - closed below
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=out,  # noqa: S603
                                   stderr=subprocess.STDOUT)
        processes.append((process, out))
    codes = []
    for process, out in processes:
        codes.append(process.wait())
        out.close()
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if any(codes):
        for i in range(len(commands)):
            sys.stderr.write(log.with_suffix(f".{i}.log").read_text()[-3000:])
        raise SystemExit(f"a run failed ({codes}); logs in {log.parent}")
    return elapsed, cpu


# -- (b) plain datatrove --------------------------------------------------------------------
def plain_datatrove(spec_path: str) -> None:
    """The spec's steps with datatrove's own classes and LocalPipelineExecutor, 1 task."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup import (
        ExactDedupFilter,
        ExactDedupSignature,
        ExactFindDedups,
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.tokens import DocumentTokenizer

    from ylink.runners.data_steps import build_step, exact_dedup_config
    from ylink.runners.shards import EOS_TOKEN, byte_tokenizer

    try:
        import orjson  # noqa: F401 - datatrove's JSONL reader and writer need it
        from datatrove.pipeline.readers import JsonlReader
        from datatrove.pipeline.writers import JsonlWriter

        def reader(folder):
            return JsonlReader(folder, compression=None)

        def writer(folder):
            return JsonlWriter(folder, compression=None)
    except ImportError:  # same work with the runner's JSONL classes (stdlib json)
        print("note: orjson is not installed; plain datatrove uses the runner's JSONL reader "
              "and writer (stdlib json) instead of JsonlReader/JsonlWriter", flush=True)
        from ylink.runners.data_steps import InputReader, JsonlFileWriter, RankFileReader

        def reader(folder):
            if folder == spec["input"]["path"]:
                return InputReader(folder, str(work / "input-stats"))
            return RankFileReader(folder)

        def writer(folder):
            return JsonlFileWriter(folder)

    spec = json.loads(Path(spec_path).read_text())
    from ylink.steps import validate_steps

    steps = validate_steps(spec["steps"])
    work = Path(spec["work_dir"])
    out = spec["output_dir"]
    tokenizer_file = work / "tokenizer.json"
    work.mkdir(parents=True, exist_ok=True)
    byte_tokenizer().save(str(tokenizer_file))

    def execute(pipeline, name, tasks=1):
        LocalPipelineExecutor(pipeline, tasks=tasks, workers=1, logging_dir=str(work / name),
                              skip_completed=False).run()

    pipeline = [reader(spec["input"]["path"])]
    stage = 0
    for index, step in enumerate(steps):
        kind, params = step["type"], step["params"]
        if kind in ("exact_dedup", "minhash_dedup"):
            folder = work / f"dedup-{index}"
            docs = str(work / f"stage-{stage}")
            if kind == "exact_dedup":
                config = exact_dedup_config(params)
                signature = ExactDedupSignature(str(folder / "sigs"), config)
                execute([*pipeline, writer(docs), signature], f"logs-{stage}")
                execute([ExactFindDedups(str(folder / "sigs"), str(folder / "dups"), config)],
                        f"logs-{stage}-find")
                pipeline = [reader(docs), ExactDedupFilter(str(folder / "dups"), config)]
            else:
                config = MinhashConfig(n_grams=params["n_grams"],
                                       num_buckets=params["num_buckets"],
                                       hashes_per_bucket=params["hashes_per_bucket"],
                                       seed=params["seed"])
                signature = MinhashDedupSignature(str(folder / "sigs"), config=config)
                execute([*pipeline, writer(docs), signature], f"logs-{stage}")
                execute([MinhashDedupBuckets(str(folder / "sigs"), str(folder / "buckets"),
                                             config=config)],
                        f"logs-{stage}-buckets", tasks=config.num_buckets)
                execute([MinhashDedupCluster(str(folder / "buckets"), str(folder / "remove"),
                                             config=config)], f"logs-{stage}-cluster")
                pipeline = [reader(docs), MinhashDedupFilter(str(folder / "remove"))]
            stage += 1
        elif kind == "tokenize":
            pipeline.append(DocumentTokenizer(
                out, str(tokenizer_file), local_working_dir=str(work / "tokenize"),
                eos_token=EOS_TOKEN, shuffle_documents=params["shuffle"], seed=params["seed"],
                batch_size=1000))
        else:
            pipeline.append(build_step(step))
    if steps[-1]["type"] != "tokenize":
        pipeline.append(writer(out))
    execute(pipeline, f"logs-{stage}")


# -- (d) Ray -----------------------------------------------------------------------------------
def start_ray_cluster(workers: int):
    """A Ray cluster of this machine: a head with no CPU and `workers` nodes of 1 CPU."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(workers):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    return cluster


def done_seconds(log: Path) -> float | None:
    """The runner's own time (its `done` event's stats.seconds: no process or Ray start-up)."""
    for line in reversed(log.read_text().splitlines()):
        if line.startswith("OGAI-EVENT ") and '"kind":"done"' in line.replace(" ", ""):
            return json.loads(line[len("OGAI-EVENT "):])["data"]["output"]["stats"]["seconds"]
    return None


def same_files(one: Path, two: Path) -> bool:
    """The same files, byte for byte (datatrove's .ds.metadata names the tokenizer file, which
    lies in each run's own work folder: its first field is left out)."""
    def content(path: Path) -> bytes:
        data = path.read_bytes()
        return data.split(b"|", 1)[-1] if path.name.endswith(".ds.metadata") else data

    names = sorted(p.name for p in one.iterdir())
    return names == sorted(p.name for p in two.iterdir()) and all(
        content(one / name) == content(two / name) for name in names)


# -- driver ---------------------------------------------------------------------------------
def output_counts(directory: Path) -> dict:
    import numpy as np

    documents = tokens = 0
    for index in directory.glob("*.ds.index"):
        ends = np.fromfile(index, dtype="<u8")
        documents += len(ends)
        tokens += int(ends[-1]) if len(ends) else 0
    return {"documents": documents, "tokens": tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, help="a directory of JSONL files to use")
    # Each runner process pays ~4 s of fixed cost (imports, spaCy, executors); the default
    # corpus keeps that small beside the work (~1 minute for one replica on one core).
    parser.add_argument("--docs", type=int, default=4500,
                        help="clean documents to generate (default 4500, about 7 MB)")
    parser.add_argument("--files", type=int, default=8, help="files to generate")
    parser.add_argument("--work", type=Path, help="scratch directory (default: a temp dir)")
    parser.add_argument("--plain-datatrove", metavar="SPEC", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_datatrove:
        plain_datatrove(args.plain_datatrove)
        return

    from ylink.steps import DEFAULT_PIPELINE

    work = args.work or Path(tempfile.mkdtemp(prefix="ylink-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = args.corpus
    if corpus is None:
        corpus = work / "corpus"
        shutil.rmtree(corpus, ignore_errors=True)
        make_corpus(corpus, args.docs, args.files)
    documents, size = corpus_size(corpus)
    corpus_mb = size / 1e6
    print(f"corpus: {corpus} — {documents} documents, {corpus_mb:.2f} MB, "
          f"{len(list(corpus.rglob('*.jsonl')))} files", flush=True)
    print(f"steps: {', '.join(step['type'] for step in DEFAULT_PIPELINE)}", flush=True)

    def spec(name: str, **extra) -> Path:
        path = work / f"{name}.json"
        for sub in ("out", "work"):
            shutil.rmtree(work / f"{name}-{sub}", ignore_errors=True)
        path.write_text(json.dumps({
            "run": 0, "input": {"path": str(corpus.resolve()), "format": "jsonl"},
            "output_dir": str(work / f"{name}-out"), "work_dir": str(work / f"{name}-work"),
            "steps": DEFAULT_PIPELINE, "tokenizer_path": None, **extra}))
        return path

    python = sys.executable
    runner = [python, "-m", "ylink.runners.data", "--spec"]
    # warm the page cache of the libraries so that the first timed run is not penalised
    subprocess.run([python, "-c",  # noqa: S603 "import datatrove.pipeline.filters, spacy, tokenizers; "
                    "import spacy; spacy.blank('en')"], cwd=REPO, check=True, env=clean_env())

    results, cpu = {}, {}
    one = spec("platform-1")
    results["platform"], cpu["platform"] = timed([([*runner, str(one)], clean_env())],
                                                 work / "platform-1")
    print(f"(a) platform runner, 1 replica:  {results['platform']:.1f} s "
          f"(CPU {cpu['platform']:.1f} s)", flush=True)
    plain = spec("datatrove")
    results["datatrove"], cpu["datatrove"] = timed(
        [([python, str(Path(__file__).resolve()), "--plain-datatrove", str(plain)], clean_env())],
        work / "datatrove")
    print(f"(b) plain datatrove, 1 task:     {results['datatrove']:.1f} s "
          f"(CPU {cpu['datatrove']:.1f} s)", flush=True)
    two = spec("platform-2")
    results["platform_2"], cpu["platform_2"] = timed(
        [([*runner, str(two)], clean_env(RANK=str(r), WORLD_SIZE="2")) for r in range(2)],
        work / "platform-2")
    print(f"(c) platform runner, 2 replicas: {results['platform_2']:.1f} s "
          f"(CPU {cpu['platform_2']:.1f} s)", flush=True)
    started = time.perf_counter()
    cluster = start_ray_cluster(workers=2)
    results["ray_startup"] = time.perf_counter() - started
    try:
        on_ray = spec("ray", executor="ray", tasks=2)
        results["ray"], cpu["ray"] = timed(
            [([*runner, str(on_ray)], clean_env(RAY_ADDRESS=cluster.address))], work / "ray")
    finally:
        cluster.shutdown()
    print(f"(d) platform runner, Ray, 2 workers: {results['ray']:.1f} s, the cluster's start-up "
          f"{results['ray_startup']:.1f} s more (driver CPU {cpu['ray']:.1f} s; the Ray "
          f"workers' is not counted)", flush=True)
    if os.getloadavg()[0] > (os.cpu_count() or 1):
        print(f"note: load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs: other "
              "work shared the machine; wall times are noisy (see the CPU-time overhead)",
              flush=True)

    counts = {name: output_counts(work / f"{name}-out")
              for name in ("platform-1", "datatrove", "platform-2", "ray")}
    print(f"outputs (documents, tokens): {counts}", flush=True)
    for label, key in (("platform, 1 replica", "platform"), ("plain datatrove", "datatrove"),
                       ("platform, 2 replicas", "platform_2"), ("platform, Ray", "ray")):
        seconds = results[key]
        print(f"{label:>22}: {documents / seconds:8.1f} documents/s  "
              f"{corpus_mb / seconds:6.3f} MB/s", flush=True)
    summary = {
        "corpus_mb": round(corpus_mb, 3),
        "documents": documents,
        "platform_s": round(results["platform"], 2),
        "datatrove_s": round(results["datatrove"], 2),
        "platform_2_replicas_s": round(results["platform_2"], 2),
        "platform_mb_s": round(corpus_mb / results["platform"], 4),
        "datatrove_mb_s": round(corpus_mb / results["datatrove"], 4),
        "platform_2_replicas_mb_s": round(corpus_mb / results["platform_2"], 4),
        "platform_docs_s": round(documents / results["platform"], 1),
        "datatrove_docs_s": round(documents / results["datatrove"], 1),
        "platform_2_replicas_docs_s": round(documents / results["platform_2"], 1),
        "overhead": round(results["platform"] / results["datatrove"] - 1, 4),
        "platform_cpu_s": round(cpu["platform"], 2),
        "datatrove_cpu_s": round(cpu["datatrove"], 2),
        "overhead_cpu": round(cpu["platform"] / cpu["datatrove"] - 1, 4),
        "speedup_2_replicas": round(results["platform"] / results["platform_2"], 3),
        "ray_s": round(results["ray"], 2),
        "ray_startup_s": round(results["ray_startup"], 2),
        "ray_with_startup_s": round(results["ray"] + results["ray_startup"], 2),
        "ray_mb_s": round(corpus_mb / results["ray"], 4),
        "ray_with_startup_mb_s": round(corpus_mb / (results["ray"] + results["ray_startup"]), 4),
        "ray_vs_gang": round(results["ray"] / results["platform_2"], 3),
        "ray_with_startup_vs_gang": round(
            (results["ray"] + results["ray_startup"]) / results["platform_2"], 3),
        # the runners' own time, without process (and Ray cluster) start-up
        "gang_run_s": done_seconds(work / "platform-2.0.log"),
        "ray_run_s": done_seconds(work / "ray.0.log"),
        "ray_same_output_as_gang": same_files(work / "platform-2-out", work / "ray-out"),
        "same_output_counts": (counts["platform-1"] == counts["datatrove"] == counts["platform-2"]
                               == counts["ray"]),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
