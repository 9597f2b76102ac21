from celery import shared_task

HEALTH_ANSWER = "pong"


@shared_task(
    name="ogai.health_ping", acks_late=False, time_limit=10, soft_time_limit=5, ignore_result=False
)
def health_ping() -> str:
    """Answered by any worker on the default queue; /readyz waits for it."""
    return HEALTH_ANSWER
