"""The Python SDK of OGAI and the `ogai` command line. Imports no Django: it installs alone in
notebooks, jobs and on laptops."""

__version__ = "0.1.0"

from ogai_client.client import OgaiClient, OgaiError
from ogai_client.models import Job, JobLogs, Notebook, Queue, Quota, User

__all__ = ["Job", "JobLogs", "Notebook", "OgaiClient", "OgaiError", "Queue", "Quota", "User",
           "__version__"]
