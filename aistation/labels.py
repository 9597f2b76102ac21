"""Labels the platform's own services put on the jobs they submit (`Job.labels`)."""

# How a person knows the work a job does, where a wait names what holds the resources it needs:
# "the deployment demo-tiny-gpt", "evaluation run 3". Set by the service that submits the job
# (MModel's deployments and evaluations, YLink's runs, notebooks); a job without it is
# "job <id> <name>". Free text, so it stays off the cluster's own labels (Kubernetes label
# values allow no spaces): see `aistation.services.workloads`.
OWNER_LABEL = "ogai.io/owner"
# Job labels only the platform reads, never passed on to a workload.
PLATFORM_ONLY_LABELS = frozenset({OWNER_LABEL})


def job_display(owner: str | None, job_id: int, name: str) -> str:
    """The job as a wait names it: its owner label, else "job 12 train-gpt"."""
    return owner or f"job {job_id} {name}"
