"""The cluster page lists the environments jobs there may name, for those who run there."""

from django.urls import reverse


def test_the_cluster_page_lists_its_environments_for_tenants_with_a_queue(signed_in, world,
                                                                         local_queue, tmp_path):
    cluster = local_queue.cluster
    cluster.options = {**cluster.options, "environments": {"old": str(tmp_path / "gone")}}
    cluster.save(update_fields=["options"])
    url = reverse("frontend:cluster", args=[cluster.name])
    page = signed_in(world.alpha_member, world.alpha).get(url).content.decode()
    assert 'id="cluster-environments"' in page
    assert 'data-environment="platform"' in page and "2.13.0" in page
    assert 'data-environment="old"' in page and "Unusable" in page and "is not a folder" in page
    # The cluster is shared, but beta has no queue on it: no environments for beta.
    other = signed_in(world.beta_member, world.beta).get(url)
    assert other.status_code == 200
    assert 'id="cluster-environments"' not in other.content.decode()
