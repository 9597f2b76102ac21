"""The OpenAI-compatible gateway's cost: latency it adds, and requests per second through it.

Three processes: a stub model server (raw asyncio, answers at once: `/v1/chat/completions` as
JSON with usage, or as a stream of SSE chunks), the platform itself under uvicorn exactly as
`make run` starts it (`ogai.asgi:application`, real settings, SQLite in a temporary
OGAI_DATA_DIR, migrated; a tenant, a user, an API token and a deployment whose ready replica is
the stub, made through the ORM; rate limits raised out of the way), and this one, the client
(aiohttp).

1. Latency: 32 concurrent streaming clients, each sending requests one after the other, times
   to the first and the last byte; straight to the stub, then through the gateway, in
   `--rounds` short alternating rounds (2 x `--seconds` in all each way), so both see the same
   neighbours. The stub streams `--chunks` events `--gap-ms` apart, as a model emits tokens (a
   stream that ends at once would make this a throughput test, where 32 clients only queue).
   Added latency = the gateway's time to first byte minus the stub's, per percentile
   (`added_ms_p50`, `added_ms_p99`): what the gateway does before the answer starts
   (authentication, limits, routing, the upstream request). The last byte's percentiles are
   printed beside; they carry the stub's pacing and timer jitter, a few ms either way.
2. Throughput: `--clients` concurrent clients send non-streaming chat completions back to back
   for `--seconds` through the gateway (`rps`), and straight to the stub for the client's own
   ceiling (`direct_rps`).

    .venv/bin/python bench/gateway.py [--seconds 6] [--rounds 8] [--clients 64] [--chunks 8]
                                      [--gap-ms 20] [--cache-url redis://127.0.0.1:6379/15]

The last line is one JSON object: added_ms_p50, added_ms_p99, rps (targets: <= 3, <= 10,
>= 500), with the raw percentiles beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MODEL = "stub"
SERVED = "/models/stub-served"
STREAMS = 32


# -- the stub model server --------------------------------------------------------------------


def _stub_bodies(chunks: int) -> tuple[bytes, list[bytes]]:
    answer = json.dumps({
        "id": "chatcmpl-stub", "object": "chat.completion", "created": 1, "model": SERVED,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "Hello from the stub."}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
    }, separators=(",", ":")).encode()
    events = []
    for i in range(chunks):
        delta = {"role": "assistant", "content": ""} if i == 0 else {"content": f"tok{i} "}
        events.append(b"data: " + json.dumps({
            "id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": 1,
            "model": SERVED, "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
        }, separators=(",", ":")).encode() + b"\n\n")
    events.append(b"data: " + json.dumps({
        "id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": 1, "model": SERVED,
        "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": chunks - 1,
                                 "total_tokens": 11 + chunks},
    }, separators=(",", ":")).encode() + b"\n\n" + b"data: [DONE]\n\n")
    return answer, events


class StubProtocol(asyncio.Protocol):
    """HTTP/1.1 with keep-alive, Content-Length bodies only: just what the clients send."""

    def __init__(self, answer: bytes, events: list[bytes], gap_s: float) -> None:
        self.answer = answer
        self.events = events
        self.gap_s = gap_s
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buffer[:head_end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if len(self.buffer) < head_end + 4 + length:
                return
            body = self.buffer[head_end + 4:head_end + 4 + length]
            self.buffer = self.buffer[head_end + 4 + length:]
            self.respond(body)

    def respond(self, body: bytes) -> None:
        assert self.transport is not None
        stream = b'"stream":true' in body.replace(b" ", b"")
        if not stream:
            self.transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                + str(len(self.answer)).encode() + b"\r\n\r\n" + self.answer)
            return
        self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n")
        loop = asyncio.get_running_loop()
        transport = self.transport
        parts = [b"%x\r\n%s\r\n" % (len(e), e) for e in self.events] + [b"0\r\n\r\n"]

        def emit(i: int) -> None:
            if transport.is_closing():
                return
            if i == len(parts) - 2:  # the usage event and the terminator go together
                transport.write(parts[i] + parts[i + 1])
                return
            transport.write(parts[i])
            if self.gap_s > 0:
                loop.call_later(self.gap_s, emit, i + 1)
            else:
                emit(i + 1)

        emit(0)


def serve_stub(port: int, chunks: int, gap_ms: float) -> None:
    answer, events = _stub_bodies(chunks)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: StubProtocol(answer, events, gap_ms / 1000.0), "127.0.0.1", port,
            backlog=1024)
        async with server:
            await server.serve_forever()

    with contextlib.suppress(KeyboardInterrupt):  # SIGINT is how the bench stops it
        asyncio.run(main())


# -- the platform's side: data and server -----------------------------------------------------


def setup_platform(stub_url: str) -> None:
    """Migrate, then make a tenant, a user, an API token and a deployment on the stub; print
    the token's secret on the last line."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ogai.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)

    from aistation.choices import JobState
    from aistation.models import Job, Queue
    from infra_os.choices import Role
    from infra_os.models import Membership, Tenant
    from infra_os.services.tokens import api_token_create
    from mmodel.choices import VersionSource, VersionStatus, WeightsFormat
    from mmodel.models import Deployment, DeploymentReplica, Model, ModelVersion
    from podsys.models import Cluster

    tenant = Tenant.objects.create(name="bench")
    user = get_user_model().objects.create_user("bench")
    Membership.objects.create(tenant=tenant, user=user, role=Role.MEMBER)
    secret = api_token_create(actor=user, name="bench", expires_at=None).secret
    cluster = Cluster.objects.create(name="bench", driver="fake", options={"nodes": 1})
    queue = Queue.objects.create(tenant=tenant, name="default", cluster=cluster)
    model = Model.objects.create(tenant=tenant, name=MODEL)
    version = ModelVersion.objects.create(model=model, number=1, source=VersionSource.IMPORT,
                                          format=WeightsFormat.SAFETENSORS,
                                          status=VersionStatus.READY)
    deployment = Deployment.objects.create(tenant=tenant, name=MODEL, version=version,
                                           queue=queue)
    job = Job.objects.create(tenant=tenant, queue=queue, cluster=cluster, name="stub-replica",
                             command=["stub"], service=True, state=JobState.RUNNING)
    DeploymentReplica.objects.create(deployment=deployment, index=0, job=job, upstream=stub_url,
                                     served_model=SERVED, ready=True)
    print(secret)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_port(port: int, process: subprocess.Popen, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{what} exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{what} did not listen on {port}")


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        # SIGINT: uvicorn shuts down gracefully (and a profiler, if any, writes its file).
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


# -- the client -------------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def _latency(targets: list[tuple[str, dict, str]], rounds: int,
                   seconds: float) -> list[list[tuple[float, float]]]:
    """STREAMS clients streaming back to back, (time to first byte, time to last byte) in ms
    each, against each target in turn for `seconds`, `rounds` times over: alternating in short
    rounds, both sides see the same neighbours on a shared machine."""
    import aiohttp

    sessions = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=STREAMS))
                for _ in targets]
    times: list[list[tuple[float, float]]] = [[] for _ in targets]

    async def one(i: int) -> tuple[float, float]:
        url, headers, model = targets[i]
        body = json.dumps({"model": model, "stream": True,
                           "messages": [{"role": "user", "content": "Say hello."}]}).encode()
        t0 = time.perf_counter()
        async with sessions[i].post(url, data=body, headers={
                **headers, "Content-Type": "application/json"}) as response:
            if response.status != 200:
                raise SystemExit(f"{url}: {response.status} {await response.text()}")
            first = None
            async for _ in response.content.iter_any():
                if first is None:
                    first = time.perf_counter()
        last = time.perf_counter()
        return ((first or last) - t0) * 1000, (last - t0) * 1000

    try:
        for i in range(len(targets)):  # warm the connections
            for _ in range(2):
                await asyncio.gather(*(one(i) for _ in range(STREAMS)))
        for _ in range(rounds):
            for i in range(len(targets)):
                end = time.monotonic() + seconds

                async def client(i: int = i, end: float = end) -> None:
                    while time.monotonic() < end:
                        times[i].append(await one(i))

                await asyncio.gather(*(client() for _ in range(STREAMS)))
    finally:
        for session in sessions:
            await session.close()
    return times


async def _throughput(url: str, headers: dict, seconds: float, clients: int,
                      model: str) -> float:
    import aiohttp

    body = json.dumps({"model": model,
                       "messages": [{"role": "user", "content": "Say hello."}]}).encode()
    headers = {**headers, "Content-Type": "application/json"}
    done = 0
    failed = 0
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one() -> None:
            nonlocal done, failed
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                if response.status == 200:
                    done += 1
                else:
                    failed += 1

        await asyncio.gather(*(one() for _ in range(clients * 2)))  # warm up
        done = failed = 0
        t0 = time.monotonic()
        end = t0 + seconds

        async def client() -> None:
            while time.monotonic() < end:
                await one()

        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.monotonic() - t0
    if failed:
        raise SystemExit(f"{url}: {failed} requests failed")
    return done / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--gap-ms", type=float, default=20.0)
    parser.add_argument("--cache-url", default="", help="Redis for the rate limits (default: "
                        "the in-memory cache, as `make run`)")
    parser.add_argument("--stub", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--setup", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stub:
        serve_stub(args.stub, args.chunks, args.gap_ms)
        return
    if args.setup:
        setup_platform(args.setup)
        return

    work = Path(tempfile.mkdtemp(prefix="ogai-bench-gateway-"))
    env = {**os.environ, "OGAI_DATA_DIR": str(work), "DJANGO_SETTINGS_MODULE": "ogai.settings",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "OGAI_GATEWAY_TENANT_RPM": "100000000",
           "OGAI_GATEWAY_TOKEN_RPM": "100000000", "OGAI_GATEWAY_TENANT_TPM": "1000000000",
           "OGAI_GATEWAY_TOKEN_TPM": "1000000000"}
    env.pop("DATABASE_URL", None)
    env.pop("OGAI_CACHE_URL", None)
    if args.cache_url:
        env["OGAI_CACHE_URL"] = args.cache_url
    stub_port, web_port = _free_port(), _free_port()
    stub_url = f"http://127.0.0.1:{stub_port}"
    processes: list[subprocess.Popen] = []
    try:
        stub = subprocess.Popen(  # noqa: S603
            [sys.executable, __file__, "--stub", str(stub_port), "--chunks", str(args.chunks),
             "--gap-ms", str(args.gap_ms)], env=env, start_new_session=True)
        processes.append(stub)
        print("migrating a fresh database...", flush=True)
        setup = subprocess.run([sys.executable, __file__, "--setup", stub_url],  # noqa: S603
                               env=env,
                               cwd=REPO, capture_output=True, text=True, check=True)
        secret = setup.stdout.strip().splitlines()[-1]
        log = (work / "web.log").open("w")
        web = subprocess.Popen(  # noqa: S603
            [sys.executable, "-m", "uvicorn", "ogai.asgi:application", "--host", "127.0.0.1",
             "--port", str(web_port), "--no-access-log", "--log-level", "warning"],
            env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        processes.append(web)
        _wait_port(stub_port, stub, "the stub")
        _wait_port(web_port, web, "the platform")

        direct = f"{stub_url}/v1/chat/completions"
        gateway = f"http://127.0.0.1:{web_port}/v1/chat/completions"
        auth = {"Authorization": f"Bearer {secret}"}
        print(f"latency: {STREAMS} concurrent streams of {args.chunks} chunks "
              f"{args.gap_ms:g} ms apart, {args.rounds} rounds each way, "
              f"{2 * args.seconds:g} s in all each way", flush=True)
        direct_ms, gateway_ms = asyncio.run(_latency(
            [(direct, {}, SERVED), (gateway, auth, MODEL)], args.rounds,
            2 * args.seconds / args.rounds))
        # The gateway's own cost is what it adds before the answer starts (authentication,
        # limits, routing, the upstream request): time to first byte. The time to the last byte
        # is dominated by the stub's paced chunks and its timer jitter (a few ms either way), so
        # it is printed beside, not used for the target.
        first_d, last_d = ([t[k] for t in direct_ms] for k in (0, 1))
        first_g, last_g = ([t[k] for t in gateway_ms] for k in (0, 1))
        p50_d, p99_d = _percentile(first_d, 0.5), _percentile(first_d, 0.99)
        p50_g, p99_g = _percentile(first_g, 0.5), _percentile(first_g, 0.99)
        last = {name: round(_percentile(values, q), 2) for name, values, q in (
            ("direct_last_byte_ms_p50", last_d, 0.5), ("direct_last_byte_ms_p99", last_d, 0.99),
            ("gateway_last_byte_ms_p50", last_g, 0.5),
            ("gateway_last_byte_ms_p99", last_g, 0.99))}
        print(f"  first byte, direct:  p50 {p50_d:.2f} ms  p99 {p99_d:.2f} ms  "
              f"({len(direct_ms)} streams)")
        print(f"  first byte, gateway: p50 {p50_g:.2f} ms  p99 {p99_g:.2f} ms  "
              f"({len(gateway_ms)} streams)")
        print(f"  last byte: direct p50 {last['direct_last_byte_ms_p50']} ms, gateway p50 "
              f"{last['gateway_last_byte_ms_p50']} ms")

        print(f"throughput: {args.clients} clients, non-streaming, {args.seconds:g} s",
              flush=True)
        direct_rps = asyncio.run(_throughput(direct, {}, args.seconds, args.clients, SERVED))
        cpu0, t0 = _cpu_s(web.pid), time.monotonic()
        rps = asyncio.run(_throughput(gateway, auth, args.seconds, args.clients, MODEL))
        # The gateway's own CPU per request, which the other processes on the machine do not
        # change: 1000 / cpu_ms_per_request is what one core would pass.
        cpu_ms = (_cpu_s(web.pid) - cpu0) * 1000 / (rps * (time.monotonic() - t0))
        print(f"  direct:  {direct_rps:.0f} requests/s (the client's own ceiling)")
        print(f"  gateway: {rps:.0f} requests/s, {cpu_ms:.2f} ms of its CPU per request")
        time.sleep(2.5)  # the gateway's batched writes land
        records = _count_usage(work)
        print(f"  usage records written by the gateway: {records}")
        result = {
            "added_ms_p50": round(p50_g - p50_d, 2), "added_ms_p99": round(p99_g - p99_d, 2),
            "rps": round(rps, 1), "direct_rps": round(direct_rps, 1),
            "gateway_cpu_ms_per_request": round(cpu_ms, 3),
            "direct_first_byte_ms_p50": round(p50_d, 2),
            "direct_first_byte_ms_p99": round(p99_d, 2),
            "gateway_first_byte_ms_p50": round(p50_g, 2),
            "gateway_first_byte_ms_p99": round(p99_g, 2), **last,
            "streams": STREAMS, "stream_samples": len(gateway_ms),
            "mean_stream_ms": round(statistics.fmean(last_g), 2),
            "cache": "redis" if args.cache_url else "locmem",
        }
    finally:
        for process in reversed(processes):
            _stop(process)
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))


def _count_usage(work: Path) -> int:
    import sqlite3

    with sqlite3.connect(work / "ogai.sqlite3") as db:
        return db.execute("select count(*) from infra_os_usagerecord").fetchone()[0]


if __name__ == "__main__":
    main()
