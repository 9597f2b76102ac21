from aistation.models.jobs import Attempt, Job, JobEvent
from aistation.models.queues import Queue

__all__ = ["Attempt", "Job", "JobEvent", "Queue"]
