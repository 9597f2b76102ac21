"""L1, the cluster system: clusters, nodes, software stacks, deployments, health and drivers."""
