"""The log store on PostgreSQL: ingest rate of job output, and search latency against `grep -F`.

Lines: 5,000,000 (`--lines`) generated with a fixed seed for one tenant running 64 jobs
(`--jobs`) of 1 to 8 replicas over 3 days (each job starts and ends at its own time within
them): training progress in four styles (plain `step … loss= lr= grad_norm= tokens/s=`,
Hugging Face dicts, Megatron `iteration … | lm loss: … | number of nan iterations: …`,
Lightning progress bars), NCCL INFO and WARN lines, data loader and checkpoint lines, PyTorch
and c10d warnings, GPU and eval lines, and now and then a Python traceback (5 to 14 lines,
ending in `torch.OutOfMemoryError: CUDA out of memory. …`, `RuntimeError: NCCL error in: …`,
`ConnectionResetError: …` and the like). Each replica's lines go, message text only, to
`<tmp>/job-<J>/attempt-1/replica-<R>.log` as the local driver keeps them; their timestamps
(evenly spread over the job's run, increasing) stay in memory. Generating them is not timed.

Ingest: 64 producer threads, one per job, read their replicas' files with the local driver's
own `read_log_file` (chunks of `--chunk-kb`, 256 KiB), make `LogLine`s as the shipper does
(`log_shipping.line_level` for the level, 1-based line numbers per replica, attempt 1) and put
each chunk on a bounded queue; writer threads take chunks off it and call
`PostgresLogStore.append` with `--batch` lines (5,000) and the cursors they advance. The ingest
runs once per entry of `--writers` (1,2), each into a fresh database: one writer is one
transaction at a time; two is the platform's shipper as it is configured by default
(`OGAI_LOGS_WRITERS`=2: a pass writes its replicas in that many transactions at once, see
`log_shipping.store_pending`). `ingest_lines_s` is the figure with the platform's default
number of writers (`ingest_lines_s_1_writer`, `ingest_lines_s_2_writers` beside it):
lines over the wall time from starting the producers to
the last batch committed, reading the files and building the lines included, as the shipper
pays them. The CPU seconds of this process, of PostgreSQL's processes and of the rest of the
machine over the ingest are printed beside it, to tell where the time goes. The searches run
on the last ingest's database. Three days of lines arrive in minutes, each job's in the order
of its own files: the table's rows follow time only loosely, where the platform's shipper
stamps each pass `now` and so stores rows in time order; scans of the (tenant, time) index
touch more pages here than they would there.

Then `ANALYZE log_line` (the server here runs with autovacuum off; in production autovacuum
would analyze, and also flush the GIN indexes' pending lists, which ANALYZE does not: their
size is printed), and one untimed read of every file and, with `pg_prewarm` in `read` mode,
of every partition and index, so that both sides run from the page cache. The 200 searches
run once through the store as the ingest left it (`before_upkeep_ms_p50`/`_p95`: every GIN
search reads each partition's pending list, up to the index's 4 MB, through), then the
store's upkeep runs (`LogStore.maintain`, which the hourly retention task runs: pending lists
merged into the indexes, partitions analyzed; `upkeep_s`), the partitions are read into the
cache again, and the timed pass below runs: three days of lines arrive here in minutes, where
the platform would have run its upkeep some 70 times over them, leaving only the current
day's pending list unmerged.

Searches: 200 (`--searches`), 50 of each kind, terms drawn with the seed: a single word (`NCCL`,
`Traceback`, `checkpoint`, `OutOfMemoryError`, `nan`, …), a quoted phrase (`"out of memory"`,
`"NCCL WARN"`, `"most recent call last"`, `"connection reset"`, …), one of either in one job
(`job_id`), and a single word within a random 24-hour window (`since`/`until`). Each runs
through `PostgresLogStore.search` as a tenant member's search does
(`Scope(tenant_ids={tenant})`, `limit=100`: the newest 100 hits), on one connection kept open
throughout, as in the platform, timed wall to wall. The grep side runs `LC_ALL=C grep -F -i -h
-- <words>` over the files in scope (every file; that job's only for job-scoped; every file for
the window, since the files carry no time) and reads its whole output through a pipe. The two
differ in what they answer: grep gives every matching line, unordered, and matches substrings;
the store gives the newest 100 lines holding the words. As a check, each store answer must match
its query (words, job, window, newest first), and must hold as many lines as grep's output has
lines matching by the store's rules (`query.matches`), up to the limit (the window kind
excepted).

A phrase search of common words first walks the tenant's newest lines (see
`aistation/logstore/postgres.py`): `walk_answered` and `walk_missed` count the searches that
walk answered and those it did not (the index then answered them).

Each search also notes which plan PostgreSQL used on the store's connection. A prepared
statement (psycopg prepares one it sees 5 times) may switch after 5 custom plans to one generic
plan for all values, and a generic plan of the window search walked millions of rows: the
store prepares nothing, so `generic_plan_searches` must be 0. After the timed pass, the same
200 searches run once more through a second store whose connection forces custom plans (the
connection option `plan_cache_mode=force_custom_plan`): `custom_plan_ms_p50`,
`custom_plan_ms_p95`, a second warm pass. The headline figures are the first pass.

Printed: p50/p95 per kind for both sides, the slowest searches, and the EXPLAIN (ANALYZE,
BUFFERS) of the slowest of each kind (`--explain`) as the store ran it: its generic plan
(PREPARE and EXPLAIN EXECUTE under force_generic_plan) where it used one, then the plan for
its values. The last line is one JSON object: `ingest_lines_s`, `search_ms_p50`,
`search_ms_p95`, `grep_ms_p50`, `grep_ms_p95`, `speedup_p50` (grep p50 over store p50),
per-kind p50s and p95s, sizes (`table_mb`: every partition with its indexes and TOAST,
`files_mb`) and `meets_ingest` (≥ 20,000 lines/s), `meets_p95` (< 200 ms) and
`meets_speedup` (≥ 20).

Uses its own database (`--database`, ogai_bench_logs, dropped and made again at the start and
dropped at the end) on `--server` (postgresql://postgres@127.0.0.1:5432). `--quick`: 100,000
lines and 20 searches (a smoke test).
"""

import argparse
import contextlib
import io
import json
import math
import os
import queue
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DATA_DIR = tempfile.mkdtemp(prefix="ogai-bench-logs-data-")
os.environ.setdefault("OGAI_DATA_DIR", DATA_DIR)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ogai.settings")

import django  # noqa: E402

django.setup()

import psycopg  # noqa: E402

from aistation.logstore.base import MAX_LIMIT, Cursor, LogLine, LogQuery, Scope  # noqa: E402
from aistation.logstore.postgres import PostgresLogStore  # noqa: E402
from aistation.logstore.query import matches, parse  # noqa: E402
from aistation.services.log_shipping import cursor_key, line_level  # noqa: E402
from podsys.drivers.local import read_log_file  # noqa: E402

TENANT = 7
FIRST_JOB = 4101
T0 = datetime(2026, 3, 2, tzinfo=UTC)
SPAN_S = 3 * 86400.0
LIMIT = 100
SINGLE = ("NCCL", "Traceback", "checkpoint", "OutOfMemoryError", "nan", "dataloader",
          "timeout", "overflow", "ConnectionResetError", "shard")
PHRASES = ("out of memory", "NCCL WARN", "most recent call last", "connection reset",
           "CUDA error", "loss scale", "Init COMPLETE", "illegal memory access")
WINDOW_TERMS = SINGLE
KINDS = ("single", "phrase", "job", "window")
TICK = os.sysconf("SC_CLK_TCK")


# Generating the lines -----------------------------------------------------------------------

@dataclass
class Job:
    id: int
    replicas: int
    start: float  # seconds after T0
    end: float
    style: str
    lines: list[int] = field(default_factory=list)  # per replica

    @property
    def workload(self) -> str:
        return f"ogai-{self.id}-1"


PY = "/usr/local/lib/python3.11/site-packages"
FRAMES = (
    ("/workspace/train.py", "<module>", "main()"),
    ("/workspace/train.py", "main", "trainer.train()"),
    (f"{PY}/transformers/trainer.py", "train", "return inner_training_loop("),
    (f"{PY}/transformers/trainer.py", "_inner_training_loop",
     "tr_loss_step = self.training_step(model, inputs)"),
    (f"{PY}/transformers/trainer.py", "training_step", "self.accelerator.backward(loss)"),
    (f"{PY}/accelerate/accelerator.py", "backward", "loss.backward(**kwargs)"),
    (f"{PY}/torch/_tensor.py", "backward", "torch.autograd.backward("),
    (f"{PY}/torch/nn/modules/module.py", "_wrapped_call_impl",
     "return self._call_impl(*args, **kwargs)"),
    (f"{PY}/torch/nn/modules/module.py", "_call_impl", "return forward_call(*args, **kwargs)"),
    (f"{PY}/torch/nn/parallel/distributed.py", "forward",
     "inputs, kwargs = self._pre_forward(*inputs, **kwargs)"),
    (f"{PY}/torch/distributed/c10d_logger.py", "wrapper", "return func(*args, **kwargs)"),
    (f"{PY}/torch/distributed/distributed_c10d.py", "all_reduce",
     "work = group.allreduce([tensor], opts)"),
    ("/workspace/model/attention.py", "forward",
     "attn = torch.softmax(scores.float(), dim=-1).to(q.dtype)"),
    (f"{PY}/torch/utils/data/dataloader.py", "__next__", "data = self._next_data()"),
)


class Replica:
    """One replica's output: a small state machine so numbers move as a run's would."""

    def __init__(self, rng: random.Random, job: Job, index: int) -> None:
        self.rng = rng
        self.job = job
        self.rank = index
        self.host = f"gpu-{(job.id * 7 + index) % 997:04d}"
        self.pid = rng.randint(1000, 99999)
        self.world = job.replicas * 8
        self.total = rng.choice((50_000, 100_000, 200_000))
        self.step = rng.randint(0, self.total // 2)
        self.every = rng.choice((1, 5, 10))
        self.loss = rng.uniform(2.0, 9.0)
        self.scale = 65536.0
        self.tokens = rng.uniform(80_000, 400_000)
        self.shard = rng.randint(0, 1023)
        self.prefix = f"[rank{index}]:" if rng.random() < 0.4 else ""

    def nccl(self, what: str) -> str:
        gpu = self.rng.randrange(8)
        return f"{self.host}:{self.pid}:{self.pid + 40 + gpu} [{gpu}] NCCL {what}"

    def progress(self) -> str:
        rng = self.rng
        self.step += self.every
        self.loss = max(0.8, self.loss * (1 - rng.uniform(0, 3e-4)) + rng.gauss(0, 0.02))
        lr = 3e-4 * min(1.0, self.step / 2000) * (0.5 + 0.5 * math.cos(
            math.pi * min(1.0, self.step / self.total)))
        loss = "nan" if rng.random() < 0.001 else f"{self.loss:.4f}"
        grad = rng.lognormvariate(0, 0.4)
        tokens = self.tokens * rng.uniform(0.9, 1.1)
        style = self.job.style
        if style == "plain":
            return (f"step {self.step}/{self.total} loss={loss} lr={lr:.3e} grad_norm={grad:.3f} "
                    f"tokens/s={tokens:,.0f} mem={rng.uniform(60, 79):.1f}GiB")
        if style == "hf":
            return (f"{{'loss': {loss}, 'grad_norm': {grad:.4f}, 'learning_rate': {lr:.4e}, "
                    f"'epoch': {self.step / self.total * 3:.2f}}}")
        if style == "megatron":
            ms = 8192 / tokens * 1e3 * 64
            return (f" iteration {self.step:8d}/{self.total:8d} | consumed samples: "
                    f"{self.step * 1024:12d} | elapsed time per iteration (ms): {ms:.1f} | "
                    f"learning rate: {lr:.3E} | global batch size:  1024 | lm loss: "
                    f"{self.loss:.6E} | loss scale: {self.scale:.1f} | grad norm: {grad:.3f} | "
                    f"number of skipped iterations:   0 | number of nan iterations:   0 |")
        epoch_steps = self.total // 10
        done = self.step % epoch_steps
        bar = "\u2588" * (10 * done // epoch_steps)
        return (f"Epoch {self.step // epoch_steps}: {100 * done // epoch_steps:3d}%|{bar:<10}| "
                f"{done}/{epoch_steps} [{done // 3600}:{done // 60 % 60:02d}:{done % 60:02d}"
                f"<1:25:41, {rng.uniform(0.8, 2.5):.2f}it/s, v_num=0, train_loss={loss}, "
                f"lr={lr:.2e}]")

    def nccl_info(self) -> str:
        rng = self.rng
        pick = rng.randrange(6)
        if pick == 0:
            channel, peer = rng.randrange(32), (self.rank * 8 + rng.randrange(8)) % self.world
            return self.nccl(f"INFO Channel {channel:02d}/0 : {self.rank * 8}[0] -> {peer}"
                             f"[{peer % 8}] via P2P/IPC/read")
        if pick == 1:
            return self.nccl(f"INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB "
                             f"[3]mlx5_3:1/IB ; OOB ib0:10.1.{self.rank}.{rng.randrange(250)}<0>")
        if pick == 2:
            return self.nccl(f"INFO comm 0x{rng.getrandbits(40):x} rank {self.rank * 8} nranks "
                             f"{self.world} cudaDev {rng.randrange(8)} busId "
                             f"{rng.choice(('1b', '43', '52', '61', '9d', 'c3'))}000 commId "
                             f"0x{rng.getrandbits(60):x} - Init COMPLETE")
        if pick == 3:
            return self.nccl("INFO Connected all rings")
        if pick == 4:
            return self.nccl(f"INFO {rng.randrange(2, 32)} coll channels, {rng.randrange(2, 32)} "
                             f"nvls channels, 0 p2p channels, 32 p2p channels per peer")
        return self.nccl("INFO Using network IB")

    def nccl_warn(self) -> str:
        rng = self.rng
        ip = f"10.1.{rng.randrange(64)}.{rng.randrange(250)}"
        pick = rng.randrange(5)
        if pick == 0:
            return self.nccl(f"WARN NET/IB : Got completion from peer {ip}<{rng.randrange(60000)}>"
                             f" with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid "
                             f"::ffff:10.1.{self.rank}.7 remoteGids::ffff:{ip}")
        if pick == 1:
            return self.nccl(f"WARN socketProgressOpt: Call to recv from {ip}<"
                             f"{rng.randrange(60000)}> failed : Connection reset by peer")
        if pick == 2:
            return self.nccl("WARN Cuda failure 'out of memory'")
        if pick == 3:
            return self.nccl(f"WARN Timeout waiting for connection from peer {ip}<"
                             f"{rng.randrange(60000)}>")
        return self.nccl(f"WARN [Proxy Service {self.rank * 8}] Failed to execute operation "
                         f"Connect from rank {rng.randrange(self.world)}, retcode 3")

    def dataloader(self) -> str:
        rng = self.rng
        pick = rng.randrange(3)
        if pick == 0:
            self.shard = (self.shard + 1) % 1024
            return (f"[dataloader] worker {rng.randrange(16)} loaded shard "
                    f"{self.shard:05d}-of-01024 ({rng.uniform(80, 400):.1f} MB) in "
                    f"{rng.uniform(0.1, 4):.2f}s")
        if pick == 1:
            return (f"dataloader: prefetch queue {rng.randrange(17)}/16, waited "
                    f"{rng.uniform(0, 40):.1f} ms for batch {self.step}")
        return (f"[dataloader] epoch {self.step * 3 // self.total} reshuffled "
                f"{rng.randrange(10**6, 10**8):,} samples with seed {rng.randrange(10**6)}")

    def checkpoint(self) -> str:
        rng = self.rng
        where = f"/mnt/ckpt/{self.job.workload}/step_{self.step:07d}"
        pick = rng.randrange(4)
        if pick == 0:
            return f"Saving checkpoint to {where} ..."
        if pick == 1:
            return (f"Checkpoint saved in {rng.uniform(3, 90):.1f}s ({rng.uniform(1, 60):.2f} GiB, "
                    f"{self.world} shards)")
        if pick == 2:
            return f"[rank{self.rank}] loading checkpoint {where} (resume from step {self.step})"
        return f"  successfully saved checkpoint at iteration {self.step:8d} to {where}"

    def warning(self) -> str:
        rng = self.rng
        pick = rng.randrange(6)
        if pick == 0:
            return (f"{PY}/torch/utils/checkpoint.py:464: UserWarning: torch.utils.checkpoint: "
                    "the use_reentrant parameter should be passed explicitly.")
        if pick == 1:
            return (f"[W socket.cpp:{rng.randrange(400, 700)}] [c10d] The client socket has failed"
                    f" to connect to [{self.host}]:29500 (errno: 111 - Connection refused).")
        if pick == 2:
            return ("WARNING:torch.distributed.run: Setting OMP_NUM_THREADS environment variable "
                    "for each process to be 1 in default, to avoid your system being overloaded")
        if pick == 3:
            self.scale = max(1.0, self.scale / 2)
            return (f"Gradient overflow. Skipping step {self.step}, loss scaler 0 reducing loss "
                    f"scale to {self.scale:.1f}")
        if pick == 4:
            return (f"{self.prefix}[W ProcessGroupNCCL.cpp:{rng.randrange(1000, 4000)}] Warning: "
                    "TORCH_NCCL_ASYNC_ERROR_HANDLING is deprecated in favor of "
                    "TORCH_NCCL_ASYNC_ERROR_HANDLING")
        return (f"{PY}/torch/utils/data/dataloader.py:557: UserWarning: This DataLoader will "
                f"create {rng.choice((16, 32))} worker processes in total. Our suggested max "
                "number of worker in current system is 12")

    def other(self) -> str:
        rng = self.rng
        if rng.random() < 0.5:
            return (f"GPU {rng.randrange(8)}: util {rng.randrange(60, 101)}% mem "
                    f"{rng.randrange(40000, 81000)}MiB temp {rng.randrange(40, 85)}C power "
                    f"{rng.randrange(200, 700)}W")
        val = self.loss * rng.uniform(0.95, 1.1)
        return (f"eval step {self.step}: val_loss={val:.4f} ppl={math.exp(min(val, 20)):.2f} "
                f"accuracy={rng.uniform(0.2, 0.7):.3f}")

    def traceback(self) -> list[str]:
        rng = self.rng
        pre = self.prefix
        frames = sorted(rng.sample(range(len(FRAMES)), rng.randint(2, 6)))
        out = [f"{pre}Traceback (most recent call last):"]
        for index in frames:
            path, fn, code = FRAMES[index]
            out.append(f'{pre}  File "{path}", line {rng.randrange(20, 4000)}, in {fn}')
            out.append(f"{pre}    {code}")
        pick = rng.randrange(7)
        gpu = rng.randrange(8)
        if pick <= 1:
            used = rng.uniform(70, 79)
            out.append(f"{pre}torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                       f"{rng.choice((0.5, 1.0, 2.0, 4.0, 8.0)):.2f} GiB. GPU {gpu} has a total "
                       f"capacity of 79.15 GiB of which {79.15 - used:.2f} GiB is free. Including "
                       f"non-PyTorch memory, this process has {used:.2f} GiB memory in use.")
        elif pick == 2:
            out.append(f"{pre}RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/"
                       f"ProcessGroupNCCL.cpp:1970, unhandled system error (run with "
                       f"NCCL_DEBUG=INFO for details), NCCL version 2.20.5")
            out.append(f"{pre}ncclSystemError: System call (e.g. socket, malloc) or external "
                       f"library call failed or device error.")
        elif pick == 3:
            out.append(f"{pre}ConnectionResetError: [Errno 104] Connection reset by peer")
        elif pick == 4:
            out.append(f"{pre}RuntimeError: CUDA error: an illegal memory access was encountered")
            out.append(f"{pre}CUDA kernel errors might be asynchronously reported at some other "
                       "API call, so the stacktrace below might be incorrect.")
        elif pick == 5:
            out.append(f"{pre}FileNotFoundError: [Errno 2] No such file or directory: "
                       f"'/data/datasets/corpus/part-{rng.randrange(1024):05d}.parquet'")
        else:
            out.append(f"{pre}[Rank {self.rank * 8}] Watchdog caught collective operation "
                       f"timeout: WorkNCCL(SeqNum={rng.randrange(10**6)}, OpType=ALLREDUCE, "
                       f"NumelIn={rng.randrange(10**8)}, Timeout(ms)=600000) ran for "
                       f"{600000 + rng.randrange(100)} milliseconds before timing out.")
        return out

    def lines(self, count: int) -> list[str]:
        rng = self.rng
        out: list[str] = []
        while len(out) < count:
            u = rng.random()
            if u < 0.0004:
                out.extend(self.traceback())
            elif u < 0.012:
                out.append(self.nccl_warn())
            elif u < 0.08:
                out.append(self.nccl_info())
            elif u < 0.13:
                out.append(self.dataloader())
            elif u < 0.14:
                out.append(self.checkpoint())
            elif u < 0.17:
                out.append(self.warning())
            elif u < 0.19:
                out.append(self.other())
            else:
                out.append(self.progress())
        return out[:count]


def plan_jobs(rng: random.Random, lines: int, jobs: int) -> list[Job]:
    plan = []
    for index in range(jobs):
        replicas = rng.randint(1, 8)
        start = max(0.0, rng.uniform(-SPAN_S / 3, SPAN_S * 0.55))
        end = min(SPAN_S, start + rng.uniform(SPAN_S / 6, SPAN_S))
        style = rng.choice(("plain", "plain", "hf", "megatron", "lightning"))
        plan.append(Job(FIRST_JOB + index, replicas, start, end, style))
    weights = [(job, r, rng.lognormvariate(0, 0.5) * (job.end - job.start))
               for job in plan for r in range(job.replicas)]
    total = sum(w for _j, _r, w in weights)
    left = lines
    for position, (job, _r, weight) in enumerate(weights):
        count = left if position == len(weights) - 1 else min(left, round(lines * weight / total))
        job.lines.append(count)
        left -= count
    return plan


def generate(root: Path, plan: list[Job], seed: int) -> dict[tuple[int, int], array]:
    """Write every replica's file; return every line's timestamp (epoch seconds)."""
    stamps: dict[tuple[int, int], array] = {}
    base = T0.timestamp()
    for job in plan:
        folder = root / f"job-{job.id}" / "attempt-1"
        folder.mkdir(parents=True)
        for replica, count in enumerate(job.lines):
            rng = random.Random(seed * 1_000_003 + job.id * 16 + replica)  # noqa: S311
            text = Replica(rng, job, replica).lines(count)
            (folder / f"replica-{replica}.log").write_text(
                "".join(line + "\n" for line in text), encoding="utf-8")
            width = (job.end - job.start) / max(count, 1)
            stamps[job.id, replica] = array("d", (
                base + job.start + width * (i + rng.random() * 0.9) for i in range(count)))
    return stamps


def replica_path(root: Path, job_id: int, replica: int) -> Path:
    return root / f"job-{job_id}" / "attempt-1" / f"replica-{replica}.log"


# Ingest -------------------------------------------------------------------------------------

def cpu_of(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def machine_busy_s() -> float:
    """CPU seconds every process on this machine has used since boot (all cores)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(
        int, Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9])
    return (user + nice + system + irq + softirq + steal) / TICK


def own_cpu_s() -> float:
    """This process's CPU seconds and its finished children's (the greps)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def postgres_cpu() -> dict[int, float]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    found[int(entry.name)] = cpu_of(int(entry.name))
            except OSError:
                pass
    return found


def ingest(store: PostgresLogStore, root: Path, plan: list[Job],
           stamps: dict[tuple[int, int], array], writers: int, batch: int,
           chunk_bytes: int) -> dict:
    chunks: queue.Queue = queue.Queue(maxsize=128)
    errors: list[BaseException] = []
    busy = [0.0] * writers
    backends: list[int] = []

    def produce(job: Job) -> None:
        try:
            at = {r: Cursor() for r in range(job.replicas)}
            active = [r for r in range(job.replicas) if job.lines[r]]
            while active:
                for replica in list(active):
                    cur = at[replica]
                    chunk = read_log_file(replica_path(root, job.id, replica), cur.offset,
                                          final=True, limit=chunk_bytes)
                    when = stamps[job.id, replica]
                    first = cur.line_no
                    lines = [LogLine(ts=datetime.fromtimestamp(when[first + i], UTC),
                                     message=text, tenant_id=TENANT, job_id=job.id, attempt=1,
                                     replica=replica, line_no=first + i + 1,
                                     level=line_level(text))
                             for i, text in enumerate(chunk.lines)]
                    at[replica] = Cursor(offset=chunk.offset, line_no=first + len(lines))
                    if lines:
                        chunks.put((cursor_key(job.workload, replica), at[replica], lines))
                    if not chunk.more:
                        active.remove(replica)
        except BaseException as exc:  # reported after the run
            errors.append(exc)

    def write(index: int) -> None:
        lines: list[LogLine] = []
        moves: dict[str, Cursor] = {}

        def flush() -> None:
            started = time.perf_counter()
            store.append(lines, moves)
            busy[index] += time.perf_counter() - started
            lines.clear()
            moves.clear()

        try:
            with contextlib.suppress(AttributeError):  # its backend, for CPU accounting
                backends.append(store._db().info.backend_pid)
            while (item := chunks.get()) is not None:
                key, cursor, got = item
                lines.extend(got)
                moves[key] = cursor
                if len(lines) >= batch:
                    flush()
            if lines:
                flush()
        except BaseException as exc:
            errors.append(exc)
            while chunks.get() is not None:  # let the producers finish
                pass

    pg_before = postgres_cpu()
    busy_before = machine_busy_s()
    cpu_before = time.process_time()
    started = time.perf_counter()
    producers = [threading.Thread(target=produce, args=(job,)) for job in plan]
    consumers = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for thread in consumers + producers:
        thread.start()
    for thread in producers:
        thread.join()
    for _ in consumers:
        chunks.put(None)
    for thread in consumers:
        thread.join()
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu_before
    machine = machine_busy_s() - busy_before
    pg_after = postgres_cpu()
    if errors:
        raise errors[0]
    pg_cpu = sum(after - pg_before.get(pid, 0.0) for pid, after in pg_after.items())
    return {"wall_s": wall, "python_cpu_s": cpu, "pg_cpu_s": pg_cpu,
            "other_cpu_s": max(0.0, machine - cpu - pg_cpu),
            "writer_backend_cpu_s": sum(pg_after.get(pid, 0.0) - pg_before.get(pid, 0.0)
                                        for pid in backends),
            "append_busy_s": busy}


# Searches -----------------------------------------------------------------------------------

@dataclass
class Search:
    kind: str
    text: str
    job_id: int | None = None
    since: datetime | None = None
    until: datetime | None = None
    store_ms: float = 0.0
    grep_ms: float = 0.0
    store_hits: int = 0
    grep_lines: int = 0
    grep_matching: int = 0  # grep's lines matching by the store's rules, counted to LIMIT
    sql: tuple = ("", [], ())  # the statement the store ran, and the settings before it
    plan: str = ""  # generic or custom (PostgreSQL's plan cache), or unprepared
    custom_ms: float = 0.0  # the second pass: custom plans forced
    before_ms: float = 0.0  # the first pass, before the store's upkeep
    walk: str = ""  # answered or missed when the store walked the newest lines first

    def query(self) -> LogQuery:
        return LogQuery(scope=Scope(tenant_ids=frozenset({TENANT})), phrases=parse(self.text),
                        job_id=self.job_id, since=self.since, until=self.until, limit=LIMIT)

    def label(self) -> str:
        where = f" job={self.job_id}" if self.job_id else ""
        if self.since:
            where += f" {self.since:%m-%d %H:%M}..{self.until:%m-%d %H:%M}"
        return f"{self.kind:6s} {self.text!r}{where}"


def plan_searches(rng: random.Random, count: int, plan: list[Job]) -> list[Search]:
    searches = []
    for index in range(count):
        kind = KINDS[index % len(KINDS)]
        if kind == "single":
            searches.append(Search(kind, rng.choice(SINGLE)))
        elif kind == "phrase":
            searches.append(Search(kind, f'"{rng.choice(PHRASES)}"'))
        elif kind == "job":
            text = rng.choice(SINGLE) if rng.random() < 0.5 else f'"{rng.choice(PHRASES)}"'
            searches.append(Search(kind, text, job_id=rng.choice(plan).id))
        else:
            since = T0 + timedelta(seconds=rng.uniform(0, SPAN_S - 86400))
            searches.append(Search(kind, rng.choice(WINDOW_TERMS), since=since,
                                   until=since + timedelta(days=1)))
    return searches


def grep_files(search: Search, root: Path, plan: list[Job]) -> list[str]:
    jobs = [job for job in plan if search.job_id in (None, job.id)]
    return [str(replica_path(root, job.id, r)) for job in jobs for r in range(job.replicas)]


def run_grep(search: Search, files: list[str]) -> bytes:
    needle = search.text.strip('"')
    done = subprocess.run(["grep", "-F", "-i", "-h", "--", needle, *files],  # noqa: S603, S607
                          stdout=subprocess.PIPE, env={**os.environ, "LC_ALL": "C"}, check=False)
    if done.returncode > 1:
        raise RuntimeError(f"grep failed ({done.returncode}) for {needle!r}")
    return done.stdout


def check(search: Search, found: list, output: bytes) -> str:
    """'' when the store's answer is right as far as grep's output can tell, else why not."""
    query = search.query()
    keys = [(line.ts, line.id) for line in found]
    if keys != sorted(keys, reverse=True):
        return "not newest first"
    for line in found:
        if not matches(line.message, query.phrases) or line.tenant_id != TENANT:
            return f"line {line.id} does not match"
        if search.job_id is not None and line.job_id != search.job_id:
            return f"line {line.id} of another job"
        if search.since is not None and not search.since <= line.ts < search.until:
            return f"line {line.id} outside the window"
    count = 0
    for raw in io.BytesIO(output):
        if count >= LIMIT:
            break
        count += matches(raw.decode("utf-8", "replace"), query.phrases)
    search.grep_matching = count
    if search.kind != "window" and len(found) != count:
        return f"store found {len(found)}, grep has {count} matching (to {LIMIT})"
    return ""


def percentile(values: list[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def explain(conninfo: str, search: Search, generic: bool) -> str:
    """The plan of the very statement the store ran for this search, run again: its generic
    plan (PREPARE, EXPLAIN EXECUTE under plan_cache_mode=force_generic_plan) when the store's
    connection used one, else the plan for these values."""
    sql, params, hints = search.sql
    with psycopg.connect(conninfo, autocommit=True) as db:
        for hint in hints:  # the planner settings the store ran it with
            db.execute(hint.replace("SET LOCAL", "SET"))
        if generic:
            parts = sql.split("%s")
            numbered = "".join(f"{part}${i}" for i, part in enumerate(parts[:-1], 1)) + parts[-1]
            db.execute(f"PREPARE bench_search AS {numbered}")
            db.execute("SET plan_cache_mode = force_generic_plan")
            cur = psycopg.ClientCursor(db)
            rows = cur.execute("EXPLAIN (ANALYZE, BUFFERS) EXECUTE bench_search("
                               + ", ".join(["%s"] * len(params)) + ")", params).fetchall()
        else:
            rows = db.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params).fetchall()
    return "\n".join(row[0] for row in rows)


def record_statements(store: PostgresLogStore):
    """Keep the last statement the store runs in this thread (SQL and parameters), to EXPLAIN
    it later (the store's private `_run`, wrapped on this one instance); and a function giving
    the generic and custom plans PostgreSQL has used for this connection's prepared statements
    (psycopg prepares a statement it has run 5 times)."""
    last: list = [("", [], ())]
    run = getattr(store, "_run", None)
    if run is None:
        return last, lambda: (0, 0)

    def recording(sql: str, params=(), hints=()):
        last[0] = (sql, list(params), tuple(hints))
        return run(sql, params, hints)

    def plans() -> tuple[int, int]:
        return tuple(run("SELECT coalesce(sum(generic_plans), 0), coalesce(sum(custom_plans), 0)"
                         " FROM pg_prepared_statements "
                         "WHERE strpos(statement, 'pg_prepared_statements') = 0")[0])

    store._run = recording
    return last, plans


def count_walks(store: PostgresLogStore) -> list[str]:
    """Note, per search, whether the store walked the newest lines first and whether that
    answered it (the store's private `_walk`, wrapped on this one instance)."""
    seen: list[str] = []
    walk = store._walk

    def noting(query: LogQuery):
        found = walk(query)
        seen.append("answered" if len(found) >= min(query.limit, MAX_LIMIT) else "missed")
        return found

    store._walk = noting
    return seen


def gin_pending(db: psycopg.Connection, parts: list[str]) -> tuple[int, int]:
    """Pages and entries in the partitions' GIN pending lists."""
    return db.execute(
        "SELECT coalesce(sum((pgstatginindex(i.indexrelid)).pending_pages), 0), "
        "coalesce(sum((pgstatginindex(i.indexrelid)).pending_tuples), 0) "
        "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "JOIN pg_am a ON a.oid = c.relam WHERE a.amname = 'gin' "
        "AND i.indrelid = ANY(%s::regclass[])", [parts]).fetchone()


def warm(db: psycopg.Connection, parts: list[str]) -> None:
    """Every partition and its indexes read into the page cache (pg_prewarm, read mode)."""
    for part in parts:
        for (rel,) in db.execute(
                "SELECT %s::regclass UNION ALL SELECT indexrelid::regclass FROM pg_index "
                "WHERE indrelid = %s::regclass", [part, part]).fetchall():
            db.execute("SELECT pg_prewarm(%s, 'read')", [rel])


# Main ---------------------------------------------------------------------------------------

def fresh_database(server: str, name: str, drop_only: bool = False) -> None:
    with psycopg.connect(f"{server}/postgres", autocommit=True) as db:
        db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not drop_only:
            db.execute(f'CREATE DATABASE "{name}"')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=float, default=5e6)
    parser.add_argument("--jobs", type=int, default=64)
    parser.add_argument("--searches", type=int, default=200)
    parser.add_argument("--writers", default="1,2",
                        help="writer threads; a list ingests once with each, fresh each time")
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--chunk-kb", type=int, default=256)
    parser.add_argument("--seed", type=int, default=20260302)
    parser.add_argument("--server", default="postgresql://postgres@127.0.0.1:5432")
    parser.add_argument("--database", default="ogai_bench_logs")
    parser.add_argument("--explain", type=int, default=1,
                        help="slowest searches of each kind to EXPLAIN")
    parser.add_argument("--quick", action="store_true", help="100,000 lines, 20 searches")
    args = parser.parse_args()
    if args.quick:
        args.lines, args.searches = 1e5, 20
    lines = int(args.lines)
    args.writers = [int(w) for w in args.writers.split(",")]
    conninfo = f"{args.server}/{args.database}"
    rng = random.Random(args.seed)  # noqa: S311  (repeatable lines, not a secret)
    root = Path(tempfile.mkdtemp(prefix="ogai-bench-logs-"))
    store = None
    try:
        started = time.perf_counter()
        plan = plan_jobs(rng, lines, args.jobs)
        stamps = generate(root, plan, args.seed)
        generate_s = time.perf_counter() - started
        files_mb = sum(p.stat().st_size for p in root.rglob("*.log")) / 2**20
        replicas = sum(job.replicas for job in plan)
        print(f"generated {lines:,} lines from {args.jobs} jobs ({replicas} replicas), "
              f"{files_mb:.0f} MB of files, in {generate_s:.1f} s", flush=True)

        runs = {}
        for writers in args.writers:
            if store is not None:
                store.close()
            fresh_database(args.server, args.database)
            store = PostgresLogStore(conninfo)
            store.cursors([])  # this thread's connection and the schema, before the clock
            figures = ingest(store, root, plan, stamps, writers, args.batch,
                             args.chunk_kb * 1024)
            runs[writers] = figures
            print(f"ingest: {lines / figures['wall_s']:,.0f} lines/s ({figures['wall_s']:.1f} s, "
                  f"{writers} writer(s), batches of {args.batch:,}); CPU: this process "
                  f"{figures['python_cpu_s']:.1f} s, PostgreSQL {figures['pg_cpu_s']:.1f} s "
                  f"(writer backends {figures['writer_backend_cpu_s']:.1f} s), the rest (kernel, "
                  f"others) "
                  f"{figures['other_cpu_s']:.1f} s; append() busy "
                  f"{', '.join(f'{b:.1f}' for b in figures['append_busy_s'])} s", flush=True)
        platform = PostgresLogStore(conninfo).writers  # the shipper's default
        best = platform if platform in runs else min(runs, key=lambda w: runs[w]["wall_s"])
        figures = runs[best]
        ingest_lines_s = lines / figures["wall_s"]

        with psycopg.connect(conninfo, autocommit=True) as db:
            count = db.execute("SELECT count(*) FROM log_line").fetchone()[0]
            if count != lines:
                raise SystemExit(f"the store holds {count:,} lines, not {lines:,}")
            started = time.perf_counter()
            db.execute("ANALYZE log_line")
            analyze_s = time.perf_counter() - started
            db.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
            db.execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
            parts = [row[0] for row in db.execute(
                "SELECT inhrelid::regclass::text FROM pg_inherits "
                "WHERE inhparent = 'log_line'::regclass ORDER BY 1")]
            table_mb = sum(db.execute("SELECT pg_total_relation_size(%s)", [p]).fetchone()[0]
                           for p in parts) / 2**20
            pending = gin_pending(db, parts)
            gin_pending_mb = pending[0] * 8192 / 2**20
            started = time.perf_counter()
            warm(db, parts)
            for path in root.rglob("*.log"):
                path.read_bytes()
            warm_s = time.perf_counter() - started
        print(f"ANALYZE {analyze_s:.1f} s; {len(parts)} partitions, {table_mb:.0f} MB with "
              f"indexes; GIN pending lists {gin_pending_mb:.1f} MB ({pending[1]:,} tuples) "
              f"left after ingest; warmed in {warm_s:.1f} s", flush=True)

        searches = plan_searches(random.Random(args.seed + 1),  # noqa: S311
                                 args.searches, plan)
        # Before the store's upkeep (which the hourly retention task runs): every search
        # reads the GIN pending lists the ingest left through. Store only, no grep.
        for search in searches:
            started = time.perf_counter()
            store.search(search.query())
            search.before_ms = (time.perf_counter() - started) * 1e3
        before_all = [s.before_ms for s in searches]
        started = time.perf_counter()
        store.maintain()
        upkeep_s = time.perf_counter() - started
        with psycopg.connect(conninfo, autocommit=True) as db:
            left = gin_pending(db, parts)[0] * 8192 / 2**20
            warm(db, parts)
        print(f"before the store's upkeep: searches p50 {percentile(before_all, 0.5):.1f} ms, "
              f"p95 {percentile(before_all, 0.95):.1f} ms; upkeep (LogStore.maintain) took "
              f"{upkeep_s:.1f} s and left {left:.1f} MB of pending lists", flush=True)
        walked = count_walks(store)
        bad = []
        statement, plans = record_statements(store)
        busy_before, cpu_before, began = machine_busy_s(), own_cpu_s(), time.perf_counter()
        pg_before = postgres_cpu()
        counts = plans()
        for search in searches:
            query = search.query()
            started = time.perf_counter()
            walked.clear()
            found = store.search(query)
            search.store_ms = (time.perf_counter() - started) * 1e3
            search.walk = walked[0] if walked else ""
            search.sql = statement[0]
            search.store_hits = len(found)
            generic, custom = counts
            counts = plans()
            search.plan = ("generic" if counts[0] > generic else
                           "custom" if counts[1] > custom else "unprepared")
            files = grep_files(search, root, plan)
            started = time.perf_counter()
            output = run_grep(search, files)
            search.grep_ms = (time.perf_counter() - started) * 1e3
            search.grep_lines = output.count(b"\n")
            if why := check(search, found, output):
                bad.append(f"{search.label()}: {why}")
        search_s = time.perf_counter() - began
        pg_after = postgres_cpu()
        search_other_s = max(0.0, machine_busy_s() - busy_before - (
            own_cpu_s() - cpu_before) - sum(
            after - pg_before.get(pid, 0.0) for pid, after in pg_after.items()))
        prepared = store._run(  # which plans the search connection used
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE strpos(statement, 'pg_prepared_statements') = 0")

        # The same searches again, in another store whose connection plans every statement
        # for its values (a connection option, the store unchanged): what the generic plans
        # cost. Not interleaved with grep; the headline figures are the first pass.
        custom_store = PostgresLogStore(
            f"{conninfo}?options=-c%20plan_cache_mode%3Dforce_custom_plan")
        try:
            for search in searches:
                query = search.query()
                started = time.perf_counter()
                custom_store.search(query)
                search.custom_ms = (time.perf_counter() - started) * 1e3
        finally:
            custom_store.close()

        print(f"\n{'kind':8s}{'n':>4s}{'store p50':>11s}{'store p95':>11s}{'grep p50':>10s}"
              f"{'grep p95':>10s}{'hits':>6s}{'grep lines':>12s}{'generic':>9s}"
              f"{'custom-plan p50':>17s}{'p95':>9s}")
        result_kinds = {}

        def row(name: str, group: list[Search]) -> tuple[float, float, float]:
            store_ms = [s.store_ms for s in group]
            grep_ms = [s.grep_ms for s in group]
            custom_ms = [s.custom_ms for s in group]
            print(f"{name:8s}{len(group):4d}{percentile(store_ms, 0.5):9.1f}ms"
                  f"{percentile(store_ms, 0.95):9.1f}ms{percentile(grep_ms, 0.5):8.0f}ms"
                  f"{percentile(grep_ms, 0.95):8.0f}ms"
                  f"{statistics.mean(s.store_hits for s in group):6.0f}"
                  f"{statistics.median(s.grep_lines for s in group):12,.0f}"
                  f"{sum(s.plan == 'generic' for s in group):9d}"
                  f"{percentile(custom_ms, 0.5):15.1f}ms{percentile(custom_ms, 0.95):7.1f}ms")
            return (percentile(store_ms, 0.5), percentile(store_ms, 0.95),
                    percentile(grep_ms, 0.5))

        for kind in KINDS:
            result_kinds[kind] = row(kind, [s for s in searches if s.kind == kind])
        row("all", searches)
        store_all = [s.store_ms for s in searches]
        grep_all = [s.grep_ms for s in searches]
        custom_all = [s.custom_ms for s in searches]
        print(f"\nsearches took {search_s:.0f} s, with {search_other_s:.0f} CPU s of other "
              "processes beside them (not this one, its greps or PostgreSQL: the kernel's, "
              "other users')")
        print("\nslowest store searches:")
        slowest = sorted(searches, key=lambda s: -s.store_ms)
        for search in slowest[:12]:
            print(f"  {search.store_ms:8.1f} ms  {search.label()}  ({search.store_hits} hits, "
                  f"{search.plan} plan{', walk ' + search.walk if search.walk else ''}, "
                  f"{search.custom_ms:.1f} ms with a custom plan; grep "
                  f"{search.grep_ms:.0f} ms, {search.grep_lines:,} lines)")
        print("\nprepared statements on the search connection (generic/custom plans):")
        for text, generic, custom in prepared:
            print(f"  {generic:4d} generic {custom:4d} custom  {text[-120:]}")
        for kind in KINDS:
            group = [s for s in slowest if s.kind == kind and s.sql[0]]
            for search in group[:args.explain]:
                print(f"\nEXPLAIN (ANALYZE, BUFFERS) {search.label()}, {search.plan} plan "
                      f"(timed {search.store_ms:.1f} ms):")
                print(explain(conninfo, search, search.plan == "generic"))
                if search.plan == "generic":
                    print(f"\n  the same with a plan for its values (timed "
                          f"{search.custom_ms:.1f} ms in the second pass):")
                    print(explain(conninfo, search, False))
        if bad:
            print(f"\n{len(bad)} store answers failed the check:")
            for line in bad[:20]:
                print(f"  {line}")

        p50, p95 = percentile(store_all, 0.5), percentile(store_all, 0.95)
        grep_p50 = percentile(grep_all, 0.5)
        result = {
            "ingest_lines_s": round(ingest_lines_s),
            "search_ms_p50": round(p50, 2),
            "search_ms_p95": round(p95, 2),
            "grep_ms_p50": round(grep_p50, 1),
            "grep_ms_p95": round(percentile(grep_all, 0.95), 1),
            "speedup_p50": round(grep_p50 / p50, 1),
            "speedup_per_search_p50": round(statistics.median(
                s.grep_ms / s.store_ms for s in searches), 1),
            **{f"{kind}_ms_p50": round(p50_, 2) for kind, (p50_, _p, _g) in result_kinds.items()},
            **{f"{kind}_ms_p95": round(p95_, 2) for kind, (_m, p95_, _g) in result_kinds.items()},
            **{f"grep_{kind}_ms_p50": round(grep, 1)
               for kind, (_m, _p, grep) in result_kinds.items()},
            "search_ms_max": round(max(store_all), 1),
            "walk_answered": sum(s.walk == "answered" for s in searches),
            "walk_missed": sum(s.walk == "missed" for s in searches),
            "before_upkeep_ms_p50": round(percentile(before_all, 0.5), 2),
            "before_upkeep_ms_p95": round(percentile(before_all, 0.95), 2),
            "upkeep_s": round(upkeep_s, 1),
            "generic_plan_searches": sum(s.plan == "generic" for s in searches),
            "custom_plan_ms_p50": round(percentile(custom_all, 0.5), 2),
            "custom_plan_ms_p95": round(percentile(custom_all, 0.95), 2),
            "lines": lines, "jobs": args.jobs, "replicas": replicas, "searches": len(searches),
            **{f"ingest_lines_s_{w}_writer{'s' if w > 1 else ''}": round(lines / f["wall_s"])
               for w, f in runs.items()},
            "writers": best, "batch": args.batch,
            "ingest_s": round(figures["wall_s"], 1),
            "ingest_python_cpu_s": round(figures["python_cpu_s"], 1),
            "ingest_pg_cpu_s": round(figures["pg_cpu_s"], 1),
            "ingest_other_cpu_s": round(figures["other_cpu_s"], 1),
            "generate_s": round(generate_s, 1), "analyze_s": round(analyze_s, 1),
            "table_mb": round(table_mb), "files_mb": round(files_mb),
            "gin_pending_mb": round(gin_pending_mb, 1),
            "search_other_cpu_s": round(search_other_s, 1),
            "check_failures": len(bad),
            "meets_ingest": ingest_lines_s >= 20_000,
            "meets_p95": p95 < 200,
            "meets_speedup": grep_p50 / p50 >= 20,
        }
    finally:
        if store is not None:
            store.close()
        fresh_database(args.server, args.database, drop_only=True)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(DATA_DIR, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
