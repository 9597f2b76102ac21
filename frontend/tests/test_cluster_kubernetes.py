"""A Kubernetes cluster added from the console: the kubeconfig goes in and never comes back."""

from django.urls import reverse

from aistation.services.jobs import job_submit
from aistation.services.queues import queue_create
from podsys.models import Cluster
from podsys.services.clusters import cluster_create, cluster_sync_nodes
from tests.fakekube import fake_kube  # noqa: F401  (a fixture)


def test_an_operator_adds_a_kubernetes_cluster_and_checks_it(signed_in, world, fake_kube):  # noqa: F811
    fake_kube.add_node("gpu-0", gpus=8)
    client = signed_in(world.operator, world.alpha)
    url = reverse("frontend:cluster-create")
    bad = client.post(url, {"name": "k8s", "driver": "kubernetes",
                            "kubeconfig": f"token: {fake_kube.token}"})
    assert "kubeconfig" in bad.context["form"].errors
    assert fake_kube.token not in bad.content.decode()  # not even written back into the form

    response = client.post(url, {"name": "k8s", "driver": "kubernetes",
                                 "options": '{"default_image": "train:1"}',
                                 "kubeconfig": fake_kube.kubeconfig()})
    assert response.url == reverse("frontend:cluster", args=["k8s"])
    assert Cluster.objects.get(name="k8s").credentials
    page = client.get(response.url, follow=True).content.decode()
    assert "Check connection" in page and fake_kube.token not in page

    checked = client.post(reverse("frontend:cluster-check", args=["k8s"]), follow=True)
    text = checked.content.decode()
    assert "k8s answers: Kubernetes v1.31" in text
    assert "advertises 8 nvidia.com/gpu on 1 nodes" in text
    assert fake_kube.token not in text


def test_the_job_page_shows_its_kubernetes_objects(signed_in, world, fake_kube):  # noqa: F811
    fake_kube.add_node("gpu-0", gpus=8)
    cluster = cluster_create(actor=world.operator, name="k8s", driver="kubernetes",
                             kubeconfig=fake_kube.kubeconfig())
    cluster_sync_nodes(cluster=cluster)
    queue = queue_create(actor=world.operator, tenant=world.alpha, name="k8s", cluster=cluster)

    def submit(**extra):
        return job_submit(actor=world.alpha_member, tenant=world.alpha, queue=queue,
                          name="work", command=["python", "train.py"], **extra)

    job = submit(gpus_per_replica=2, image="registry.example.org/train:1")
    client = signed_in(world.alpha_member, world.alpha)
    page = client.get(reverse("frontend:job", args=[job.pk])).content.decode()
    assert "What runs" in page and f"ogai job render {job.pk}" in page
    part = client.get(reverse("frontend:job", args=[job.pk]), {"part": "manifests"},
                      HTTP_HX_REQUEST="true").content.decode()
    assert "kind: Job" in part and "completionMode: Indexed" in part
    assert "registry.example.org/train:1" in part
    imageless = submit(gpus_per_replica=1)
    part = client.get(reverse("frontend:job", args=[imageless.pk]), {"part": "manifests"},
                      HTTP_HX_REQUEST="true").content.decode()
    assert "cannot be rendered: no image" in part
