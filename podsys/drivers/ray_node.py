"""One node of a Ray cluster that a local workload runs (`kind: ray`): the command of each
replica of such a workload, inside its sandbox.

    python -m podsys.drivers.ray_node --role head|worker --state DIR --nodes N --gcs-port P
        [--ray-args ARGS (JSON list)] [--ready-timeout S] -- ENTRYPOINT...

Replica 0 is the head: it starts `ray start --head --block`, waits (at most `--ready-timeout`
seconds) for the cluster's N nodes to be alive, then runs ENTRYPOINT with RAY_ADDRESS set and
ends with its exit code. Replicas 1.. are workers: `ray start --address=127.0.0.1:P --block`,
until the head says the job is done. The head says so in `DIR/done` (the entrypoint's exit
code), a folder every replica of the workload shares (its run folder): each worker then stops
its own Ray node and ends with 0, so the workload ends with the entrypoint's exit code. A
worker whose Ray node dies before that ends with its code, and the gang fails.

Every Ray process a node starts runs in a process group of its own (`ray start` is started as
a session leader), stopped with SIGTERM and then SIGKILL when the node ends: nothing of Ray
outlives its replica, sandboxed or not. In a sandbox its PID namespace ends with it anyway.

Standard library only, but for `ray` itself where the head counts its nodes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

DONE_FILE = "done"
# Written by the head once every node is alive: the driver says where the cluster is only then.
READY_FILE = "ready"
STOP_GRACE_S = 5.0
# Printed by the head when the cluster never got all its nodes: the log says why.
NOT_READY_EXIT = 3


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m podsys.drivers.ray_node")
    parser.add_argument("--role", choices=("head", "worker"), required=True)
    parser.add_argument("--state", required=True, type=Path)
    parser.add_argument("--nodes", required=True, type=int)
    parser.add_argument("--gcs-port", required=True, type=int)
    parser.add_argument("--ray-args", default="[]")
    # Ray's temp folder (logs, sockets) inside the job's folder, and the short path (a
    # symbolic link to it) Ray is given: a socket's path must stay under 108 bytes.
    parser.add_argument("--temp-dir", type=Path, required=True)
    parser.add_argument("--temp-link", type=Path, required=True)
    parser.add_argument("--ready-timeout", type=float, default=120.0)
    parser.add_argument("entrypoint", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.entrypoint[:1] == ["--"]:
        args.entrypoint = args.entrypoint[1:]
    return args


def _ray_program() -> str:
    """The `ray` command of the Python environment this runs in."""
    beside = Path(sys.executable).with_name("ray")
    return str(beside) if beside.exists() else "ray"


def start_node(args: argparse.Namespace) -> subprocess.Popen[bytes]:
    address = f"127.0.0.1:{args.gcs_port}"
    where = ["--head", f"--port={args.gcs_port}"] if args.role == "head" \
        else [f"--address={address}"]
    args.temp_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        args.temp_link.unlink()
    args.temp_link.symlink_to(args.temp_dir)
    argv = [_ray_program(), "start", *where, "--block", "--node-ip-address=127.0.0.1",
            "--disable-usage-stats", f"--temp-dir={args.temp_link}", *json.loads(args.ray_args)]
    print(f"[ogai] ray node ({args.role}): {' '.join(argv)}", flush=True)
    # Its own session: the whole of this node's Ray is one process group, stopped as one.
    return subprocess.Popen(argv, start_new_session=True)  # noqa: S603 - an argument list


def session_pids(sid: int) -> list[int]:
    """The processes of session `sid`: Ray's workers make process groups of their own, but
    stay in the session of the `ray start` that made them."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                # After the command's name, in parentheses: state, ppid, pgrp, session.
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(entry))
    return found


def stop_node(node: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the node's session (`ray start --block` stops what it started), then
    SIGKILL to what is left of it after the grace."""
    for pid in session_pids(node.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline:
        node.poll()
        if not session_pids(node.pid):
            break
        time.sleep(0.1)
    for pid in session_pids(node.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        node.wait(timeout=5)


def alive_nodes(address: str) -> int:
    import ray  # the cluster's own Python environment has it: it just started a node

    if not ray.is_initialized():
        handler = signal.getsignal(signal.SIGTERM)
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
        # ray.init takes SIGTERM for itself: a cancel must still stop this node's Ray.
        signal.signal(signal.SIGTERM, handler)
    return sum(1 for node in ray.nodes() if node.get("Alive"))


def wait_ready(args: argparse.Namespace, node: subprocess.Popen[bytes]) -> str:
    """"" once the cluster has all its nodes alive, else why not."""
    address = f"127.0.0.1:{args.gcs_port}"
    deadline = time.monotonic() + args.ready_timeout
    alive, problem = 0, ""
    while time.monotonic() < deadline:
        if node.poll() is not None:
            return f"the head's Ray node ended with code {node.returncode} before it was ready"
        try:
            alive = alive_nodes(address)
            problem = ""
        except Exception as exc:  # the GCS not up yet; a node starting
            problem = f"; last error: {exc}"
        if alive >= args.nodes:
            return ""
        time.sleep(0.5)
    return (f"only {alive} of the cluster's {args.nodes} Ray nodes were alive after "
            f"{args.ready_timeout:g} s{problem}")


def run_head(args: argparse.Namespace) -> int:
    args.state.mkdir(parents=True, exist_ok=True)
    (args.state / DONE_FILE).unlink(missing_ok=True)
    (args.state / READY_FILE).unlink(missing_ok=True)
    node = start_node(args)
    code = 1
    try:
        why = wait_ready(args, node)
        with contextlib.suppress(Exception):
            import ray

            ray.shutdown()
        if why:
            print(f"[ogai] the Ray cluster never got ready: {why}", flush=True)
            code = NOT_READY_EXIT
            return code
        print(f"[ogai] Ray cluster ready: {args.nodes} nodes; running "
              f"{' '.join(args.entrypoint)}", flush=True)
        (args.state / READY_FILE).write_text("")
        env = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{args.gcs_port}"}
        entry = subprocess.Popen(args.entrypoint, env=env)  # noqa: S603 - an argument list
        code = _wait_forwarding(entry)
        print(f"[ogai] entrypoint ended with code {code}; stopping the Ray cluster",
              flush=True)
        return code
    finally:
        _write_done(args.state, code)
        stop_node(node)


def _wait_forwarding(child: subprocess.Popen[bytes]) -> int:
    """Wait for the entrypoint; a SIGTERM to this node reaches it too (the supervisor sends
    it to the whole group) and it ends as it chooses."""
    while True:
        try:
            return child.wait()
        except KeyboardInterrupt:
            continue


def _write_done(state: Path, code: int) -> None:
    with contextlib.suppress(OSError):
        partial = state / f".{DONE_FILE}.tmp"
        partial.write_text(str(code))
        partial.replace(state / DONE_FILE)


def run_worker(args: argparse.Namespace) -> int:
    node = start_node(args)
    try:
        while True:
            if (args.state / DONE_FILE).exists():
                return 0
            if node.poll() is not None:
                # The head may just have ended and taken the GCS with it.
                time.sleep(2)
                if (args.state / DONE_FILE).exists():
                    return 0
                print(f"[ogai] this worker's Ray node ended with code {node.returncode}",
                      flush=True)
                return node.returncode or 1
            time.sleep(0.2)
    finally:
        stop_node(node)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    # A cancel's SIGTERM ends the node through its `finally`: its Ray stops with it.
    signal.signal(signal.SIGTERM, stop)
    if args.role == "head":
        return run_head(args)
    return run_worker(args)


if __name__ == "__main__":
    sys.exit(main())
