from mmodel.models.arena import ArenaVote
from mmodel.models.deployments import (
    Deployment,
    DeploymentMember,
    DeploymentReplica,
    DeploymentStat,
    GatewayLimit,
)
from mmodel.models.evaluation import Benchmark, EvaluationResult, EvaluationRun, EvaluationSample
from mmodel.models.registry import Model, ModelImport, ModelVersion

__all__ = [
    "ArenaVote", "Benchmark", "Deployment", "DeploymentMember", "DeploymentReplica",
    "DeploymentStat", "EvaluationResult", "EvaluationRun", "EvaluationSample", "GatewayLimit",
    "Model", "ModelImport", "ModelVersion",
]
