"""Reads of the log store, always inside what the caller may see.

A tenant's members (any role) see its jobs' output; platform admins see every tenant's and
the platform's own lines. A job named in a query must be one the caller may see, or the read
answers 404 as for any job it may not see.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from django.shortcuts import get_object_or_404

from aistation.logstore.base import Bucket, LogQuery, Scope, StoredLine
from aistation.logstore.config import get_store
from aistation.models import Job
from infra_os.access import is_platform_admin, member_tenant_ids, scope_to_user


def log_scope(user) -> Scope:
    if is_platform_admin(user):
        return Scope(tenant_ids=None, platform=True)
    return Scope(tenant_ids=frozenset(member_tenant_ids(user).values_list("tenant_id",
                                                                          flat=True)))


def visible_job(user, job_id: int) -> Job:
    return get_object_or_404(scope_to_user(Job.objects.all(), user), pk=job_id)


def _scoped(user, query: LogQuery) -> LogQuery:
    if query.job_id is not None:
        job = visible_job(user, query.job_id)
        # A job's lines are its tenant's (and, for operators, the platform's lines about it):
        # narrow the scope to them, fewer rows to look at.
        return replace(query, scope=Scope(tenant_ids=frozenset({job.tenant_id}),
                                          platform=is_platform_admin(user)))
    return replace(query, scope=log_scope(user))


def log_search(user, query: LogQuery) -> list[StoredLine]:
    return get_store().search(_scoped(user, query))


def log_histogram(user, query: LogQuery, since: datetime, until: datetime,
                  buckets: int) -> list[Bucket]:
    return get_store().histogram(_scoped(user, query), since, until, buckets)


def log_around(user, *, job_id: int, attempt: int, replica: int, line_no: int, before: int,
               after: int) -> list[StoredLine]:
    job = visible_job(user, job_id)
    return get_store().around(Scope(tenant_ids=frozenset({job.tenant_id})), job_id=job.pk,
                              attempt=attempt, replica=replica, line_no=line_no,
                              before=before, after=after)


def tenant_log_bytes(tenant_id: int) -> int:
    """What the tenant's lines in the log store take: counted against its storage quota."""
    return sum(row.bytes for row in get_store().usage([tenant_id]))
