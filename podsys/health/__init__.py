"""Node health checks: pluggable `HealthCheck` classes (`checks`), loaded by name from
OGAI_HEALTH_CHECKS (`registry`), whose probes run ON THE NODE as workloads
(`python -m podsys.health.run`, `probes`: no Django there) and print one result line
(`result`). `podsys.services.health` starts them, judges them and cordons nodes."""

# The label that marks a workload as a health check's (its value: the check's name).
CHECK_LABEL = "ogai.io/health-check"
# Node labels the checks own: `ogai.io/health-<check>=failed` while a check fails there. A node
# sync keeps them (the cluster does not report them).
NODE_LABEL_PREFIX = "ogai.io/health-"
# Set on a node (by the operator, or by the cluster's own labels) to say how many GPUs it must
# have; without it, the most it was seen with.
EXPECTED_GPUS_LABEL = "ogai.io/expected-gpus"
# Set on a node to say which NVIDIA driver it must run; without it, the deployed profile's.
EXPECTED_DRIVER_LABEL = "ogai.io/expected-driver"
