"""Provision 100 emulated servers, registered to provisioned, as the platform does it.

A `sushy-emulator --fake` process plays 100 BMCs (power changes land 1-11 s after they are
asked, as the emulator does); the servers are registered through the service (their inventory
read by the worker), then one batch installs them all: a real Celery worker on the `provision`
queue drives every server's steps against the emulator, and this script plays each server's
first-boot agent, calling back (boot config by MAC, then the token) as soon as the emulator
shows its power on.

It prints where the time went: `wall_s` from the batch's creation to its end; `ogai_s`, the
time spent in OGAI's own code for all servers together (the worker's steps less their BMC calls,
plus the callbacks), `bmc_s` the time waiting on BMC answers, and `servers_s`, the servers'
provisioning times added up (each from its first step to its callback). `ogai_share` =
ogai_s / servers_s, and `ogai_share_of_wall` = ogai_s / wall_s (the stricter reading: OGAI's
work for all servers, as if done one after the other, against the batch's wall time).

Needs PostgreSQL and Redis as in production (DATABASE_URL, default
postgres://postgres@127.0.0.1:5432/ogai_bench_provision, created when missing; CELERY_BROKER_URL,
default redis://127.0.0.1:6379/14). `--servers N` to change the count.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/ogai_bench_provision"
DEFAULT_BROKER = "redis://127.0.0.1:6379/14"
# Worker processes: the BMC steps are short (a few HTTP calls each), so a few processes keep
# 100 servers moving; threads would add GIL waits to every step's own time.
WORKER_PROCESSES = 2


def _setup(data_dir: Path) -> None:
    os.environ.setdefault("DATABASE_URL", DEFAULT_DB)
    os.environ.setdefault("CELERY_BROKER_URL", DEFAULT_BROKER)
    os.environ["OGAI_DATA_DIR"] = str(data_dir)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ogai.settings")
    os.environ.setdefault("DEBUG", "0")
    os.environ.setdefault("SECRET_KEY", "bench-only")
    name = os.environ["DATABASE_URL"].rsplit("/", 1)[1]
    subprocess.run(["dropdb", "--if-exists", "-h", "127.0.0.1", "-U", "postgres", name],  # noqa: S603, S607
                   capture_output=True, check=False)
    subprocess.run(["createdb", "-h", "127.0.0.1", "-U", "postgres", name],  # noqa: S603, S607
                   capture_output=True, check=False)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from ogai.celery import app

    app.control.purge()


def _start_worker(log: Path) -> subprocess.Popen:
    env = {**os.environ, "OGAI_PROVISION_POLL_S": os.environ.get("OGAI_PROVISION_POLL_S", "2")}
    return subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "celery", "-A", "ogai", "worker", "--queues", "provision",
         "--pool", "prefork", "--concurrency", str(WORKER_PROCESSES), "--without-gossip",
         "--without-mingle", "--without-heartbeat", "--loglevel", "WARNING",
         "--hostname", f"bench-provision-{os.getpid()}@%h"],
        cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
        start_new_session=True)


def _wait(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench/provision.py: {what} did not happen in {timeout_s:.0f} s")
        time.sleep(0.2)


def run(servers: int) -> dict:
    from tests.redfish.emulator import RedfishEmulator

    data_dir = Path(tempfile.mkdtemp(prefix="ogai-bench-provision-"))
    _setup(data_dir)
    from django.contrib.auth import get_user_model
    from django.db.models import Max, Min, Sum

    from infra_os.choices import BatchState, RunState
    from infra_os.models import ProvisioningBatch, ProvisioningRun, Server
    from infra_os.services.provisioning import (
        batch_create,
        boot_config,
        profile_create,
        run_callback,
    )
    from infra_os.services.servers import server_register

    operator = get_user_model().objects.create(username="bench", is_staff=True,
                                               is_superuser=True)
    with RedfishEmulator(servers, username="admin", password="bench-bmc-pass") as emulator:
        worker = _start_worker(data_dir / "worker.log")
        try:
            by_name = {}
            for system in emulator.systems:
                server_register(actor=operator, name=system.name, bmc_address=emulator.url,
                                bmc_username="admin", bmc_password="bench-bmc-pass",
                                system_id=system.uuid, verify_tls=False,
                                boot_mac=system.macs[0])
                by_name[system.name] = system
            _wait(lambda: not Server.objects.filter(last_seen_at=None).exists(), 300,
                  "reading every server's inventory")
            profile = profile_create(actor=operator, name="bench")
            started = time.monotonic()
            batch = batch_create(actor=operator, name="bench", profile=profile,
                                 servers=list(Server.objects.all()),
                                 image_url="http://images.example/os.iso",
                                 concurrency=servers)
            callback_s = 0.0
            called: set[str] = set()
            while True:
                state = ProvisioningBatch.objects.values_list("state", flat=True) \
                    .get(pk=batch.pk)
                if state != BatchState.RUNNING:
                    break
                waiting = ProvisioningRun.objects.filter(
                    batch=batch, state__in=(RunState.REBOOTING, RunState.AWAITING_CALLBACK)) \
                    .values_list("server__name", "server__boot_mac")
                for name, mac in waiting:
                    if name in called or emulator.power_state(by_name[name].uuid) != "On":
                        continue
                    begin = time.perf_counter()
                    config = boot_config(mac=mac, callback_url="http://ogai/callback")
                    run_callback(token=config["token"], facts={"hostname": name})
                    callback_s += time.perf_counter() - begin
                    called.add(name)
                time.sleep(0.5)
            wall_s = time.monotonic() - started
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=30)
    batch.refresh_from_db()
    runs = ProvisioningRun.objects.filter(batch=batch)
    totals = runs.aggregate(ogai=Sum("ogai_seconds"), bmc=Sum("bmc_seconds"),
                            first=Min("started_at"), last=Max("finished_at"))
    servers_s = sum((finished - begun).total_seconds()
                    for begun, finished in runs.values_list("started_at", "finished_at"))
    ogai_s = (totals["ogai"] or 0) + callback_s
    return {
        "servers": servers,
        "provisioned": batch.summary.get("provisioned", 0),
        "failed": batch.summary.get("failed", 0),
        "wall_s": round(wall_s, 2),
        "ogai_s": round(ogai_s, 3),
        "bmc_s": round(totals["bmc"] or 0, 3),
        "callbacks_s": round(callback_s, 3),
        "servers_s": round(servers_s, 1),
        "ogai_share": round(ogai_s / servers_s, 4) if servers_s else None,
        "ogai_share_of_wall": round(ogai_s / wall_s, 4),
        "worker_processes": WORKER_PROCESSES,
        "poll_s": float(os.environ.get("OGAI_PROVISION_POLL_S", "2")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--servers", type=int, default=100)
    args = parser.parse_args()
    result = run(args.servers)
    print(f"{result['provisioned']} of {result['servers']} servers provisioned in "
          f"{result['wall_s']} s; OGAI's own time {result['ogai_s']} s, BMC answers "
          f"{result['bmc_s']} s, servers' time added up {result['servers_s']} s")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
