from podsys.models.accounts import ClusterGroup, ClusterUser
from podsys.models.clusters import Cluster, Node
from podsys.models.fleets import (
    ElasticPool,
    Fleet,
    NodeRequest,
    PoolBudget,
    PoolNode,
    ScaleEvent,
)
from podsys.models.health import HealthCheckRun, NodeMetricSnapshot
from podsys.models.stack import DeploymentRun, DeploymentTaskResult, StackProfile

__all__ = [
    "Cluster",
    "ClusterGroup",
    "ClusterUser",
    "DeploymentRun",
    "DeploymentTaskResult",
    "ElasticPool",
    "Fleet",
    "HealthCheckRun",
    "Node",
    "NodeMetricSnapshot",
    "NodeRequest",
    "PoolBudget",
    "PoolNode",
    "ScaleEvent",
    "StackProfile",
]
