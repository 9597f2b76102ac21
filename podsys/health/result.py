"""The one line a probe prints for the platform to read back from the workload's log.

`OGAI-HEALTH-RESULT {"check": ..., "ok": ..., "summary": ..., "details": {...}}` when it measured
something (good or bad), `OGAI-HEALTH-RESULT {"check": ..., "error": ...}` when it could not.
Plain Python only: probes import this on the node.
"""

from __future__ import annotations

import json
from typing import Any

RESULT_PREFIX = "OGAI-HEALTH-RESULT "


def format_result(result: dict[str, Any]) -> str:
    """The result as its log line (no newline): one line whatever the summary holds."""
    return RESULT_PREFIX + json.dumps(result, sort_keys=True, default=str)


def measured(check: str, ok: bool, summary: str, details: dict[str, Any] | None = None
             ) -> dict[str, Any]:
    return {"check": check, "ok": bool(ok), "summary": summary, "details": details or {}}


def not_run(check: str, error: str) -> dict[str, Any]:
    return {"check": check, "error": error}


def parse_result(log: str) -> dict[str, Any] | None:
    """The last result line of a log, or None when there is none (or it is not a JSON
    object): a probe that died before printing, or printed garbage."""
    for line in reversed(log.splitlines()):
        start = line.find(RESULT_PREFIX)
        if start < 0:
            continue
        try:
            found = json.loads(line[start + len(RESULT_PREFIX):])
        except ValueError:
            return None
        return found if isinstance(found, dict) else None
    return None
