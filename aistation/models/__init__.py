from aistation.models.jobs import Attempt, Job, JobEvent
from aistation.models.notebooks import Notebook, NotebookEvent, NotebookPolicy
from aistation.models.queues import Queue

__all__ = ["Attempt", "Job", "JobEvent", "Notebook", "NotebookEvent", "NotebookPolicy", "Queue"]
