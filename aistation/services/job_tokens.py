"""Job tokens: the secret a toolchain runner inside a job reports with (`ogj_<secret>`).

It opens only the runner endpoints, for its own job, and only while the job has not ended;
it acts as nobody, so it reads and changes nothing else.
"""

import hashlib
import secrets

from aistation.choices import FINAL_STATES
from aistation.models import Job, JobToken

JOB_TOKEN_SCHEME = "ogj"


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def job_token_new() -> str:
    """A fresh secret, made before the job so it can travel in the job's secret environment."""
    return f"{JOB_TOKEN_SCHEME}_{secrets.token_urlsafe(32)}"


def job_token_bind(*, job: Job, secret: str) -> JobToken:
    return JobToken.objects.create(job=job, key_hash=_hash(secret))


def job_token_authenticate(secret: str) -> Job | None:
    """The job the secret belongs to, while it has not ended; None otherwise."""
    if not secret.startswith(f"{JOB_TOKEN_SCHEME}_"):
        return None
    token = JobToken.objects.select_related("job").filter(key_hash=_hash(secret)).first()
    if token is None or token.job.state in FINAL_STATES:
        return None
    return token.job
