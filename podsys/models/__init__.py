from podsys.models.clusters import Cluster, Node

__all__ = ["Cluster", "Node"]
