"""A job's network in the SDK: read from the API, shown in words, and passed through a spec."""

from ogai_client.models import Job, Network, Node, Quota
from ogai_client.spec import parse_spec


def test_a_jobs_network_is_read_and_worded():
    job = Job.from_api({"id": 1, "name": "x", "state": "queued",
                        "network": {"attachments": ["ib-a", "roce"], "rdma": 2}})
    assert job.network == Network(attachments=("ib-a", "roce"), rdma=2)
    assert str(job.network) == "attachments ib-a, roce; 2 RDMA devices per replica"
    plain = Job.from_api({"id": 2, "name": "y", "state": "queued"})
    assert str(plain.network) == "the cluster's default network"


def test_a_spec_passes_its_network_to_the_api_as_written():
    spec = parse_spec("name: x\ncommand: [true]\nnetwork: {attachments: [ib-a], rdma: 1}\n")
    assert spec["network"] == {"attachments": ["ib-a"], "rdma": 1}


def test_nodes_and_quotas_carry_rdma():
    node = Node.from_api({"id": 1, "name": "n", "rdma_devices": 4, "rdma_in_use": 2})
    assert (node.rdma_devices, node.rdma_in_use) == (4, 2)
    assert Quota.from_api({"id": 1, "tenant": "a", "rdma_devices": 8}).rdma_devices == 8
