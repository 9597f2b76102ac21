"""The demo an operator starts from: this machine as a cluster, and stacks that pass the
compatibility matrix."""

import io

from podsys.models import Cluster, StackProfile
from podsys.services.demo import DEMO_PROFILES, demo_seed


def test_the_demo_seeds_this_machine_and_valid_example_stacks_once(db, settings, tmp_path):
    settings.DATA_DIR = tmp_path
    out = io.StringIO()
    demo_seed(stdout=out)
    demo_seed(stdout=out)  # a second `make run` adds nothing
    assert Cluster.objects.get(name="local").driver == "local"
    names = sorted(profile["name"] for profile in DEMO_PROFILES)
    assert sorted(StackProfile.objects.values_list("name", flat=True)) == names
    assert out.getvalue().count("stack profile") == len(names)
