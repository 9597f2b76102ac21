"""The Python SDK of OGAI and the `ogai` command line. Imports no Django: it installs alone in
notebooks, jobs and on laptops."""

__version__ = "0.1.0"

from ogai_client.client import OgaiClient, OgaiError
from ogai_client.models import (
    Benchmark,
    Checkpoint,
    Dataset,
    DatasetVersion,
    Deployment,
    DeploymentGrid,
    DeploymentRun,
    EvaluationRun,
    HealthCheckRun,
    HealthCheckType,
    Job,
    JobLogs,
    LeaderboardRow,
    Model,
    ModelImport,
    ModelVersion,
    Node,
    Notebook,
    PipelineRun,
    Queue,
    Quota,
    RayAddresses,
    StackProfile,
    TrainingMetric,
    TrainingRun,
    User,
    Workdir,
)
from ogai_client.ray import RayCluster

__all__ = ["Benchmark", "Checkpoint", "Dataset", "DatasetVersion", "Deployment",
           "DeploymentGrid", "DeploymentRun", "EvaluationRun", "HealthCheckRun",
           "HealthCheckType", "Job", "JobLogs", "LeaderboardRow", "Model", "ModelImport",
           "ModelVersion", "Node", "Notebook", "OgaiClient", "OgaiError", "PipelineRun",
           "Queue", "Quota", "RayAddresses", "RayCluster", "StackProfile", "TrainingMetric",
           "TrainingRun", "User", "Workdir", "__version__"]
