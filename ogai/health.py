"""Liveness and readiness probes, for people and for Kubernetes.

/healthz answers as long as the web process serves requests. /readyz also proves the database
answers a query and a Celery worker answers a task on the default queue. As on the Kubernetes API
server, `?exclude=worker` leaves a check out: a web pod's readiness probe asks only what the pod
itself needs (its database), so workers being down does not take the console off the Ingress.
"""

import time

from celery.exceptions import TimeoutError as CeleryTimeout
from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from ogai.tasks import HEALTH_ANSWER, health_ping


@never_cache
@require_GET
def healthz(request):
    return JsonResponse({"status": "ok"})


def _check_database() -> dict:
    started = time.monotonic()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:
        return {"ok": False, "detail": f"database did not answer: {exc}"}
    return {"ok": True, "latency_ms": round((time.monotonic() - started) * 1000, 1)}


def _check_worker() -> dict:
    started = time.monotonic()
    timeout = settings.OGAI_READY_WORKER_TIMEOUT
    try:
        result = health_ping.apply_async(queue="default", expires=timeout)
        answer = result.get(timeout=timeout, propagate=True)
    except CeleryTimeout:
        return {"ok": False, "detail": f"no Celery worker answered within {timeout:g} s"}
    except Exception as exc:
        return {"ok": False, "detail": f"Celery broker or result backend failed: {exc}"}
    if answer != HEALTH_ANSWER:
        return {"ok": False, "detail": f"unexpected answer from worker: {answer!r}"}
    result.forget()
    return {"ok": True, "latency_ms": round((time.monotonic() - started) * 1000, 1)}


CHECKS = {"database": _check_database, "worker": _check_worker}


@never_cache
@require_GET
def readyz(request):
    excluded = set(request.GET.getlist("exclude"))
    unknown = excluded - set(CHECKS)
    if unknown:
        return JsonResponse(
            {"status": "not ready",
             "detail": f"no check named {', '.join(sorted(unknown))}; checks: "
                       f"{', '.join(CHECKS)}"}, status=400)
    checks = {name: check() for name, check in CHECKS.items() if name not in excluded}
    ready = all(check["ok"] for check in checks.values())
    return JsonResponse(
        {"status": "ready" if ready else "not ready", "checks": checks},
        status=200 if ready else 503,
    )
