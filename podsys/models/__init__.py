from podsys.models.accounts import ClusterGroup, ClusterUser
from podsys.models.clusters import Cluster, Node
from podsys.models.health import HealthCheckRun, NodeMetricSnapshot
from podsys.models.stack import DeploymentRun, DeploymentTaskResult, StackProfile

__all__ = [
    "Cluster",
    "ClusterGroup",
    "ClusterUser",
    "DeploymentRun",
    "DeploymentTaskResult",
    "HealthCheckRun",
    "Node",
    "NodeMetricSnapshot",
    "StackProfile",
]
