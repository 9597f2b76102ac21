from aistation.models.jobs import Attempt, Job, JobEvent
from aistation.models.notebooks import Notebook, NotebookEvent, NotebookPolicy
from aistation.models.queues import Queue
from aistation.models.tokens import JobToken
from aistation.models.workdirs import Workdir

__all__ = [
    "Attempt", "Job", "JobEvent", "JobToken", "Notebook", "NotebookEvent", "NotebookPolicy",
    "Queue", "Workdir",
]
