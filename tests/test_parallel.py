"""The suite's workers never share what one test's processes hold (tests/parallel.py)."""

import pytest

from tests.parallel import SHARED, unit_of, worker_environment


def test_each_worker_has_its_own_data_folder_and_redis_broker_database():
    environ = {"OGAI_DATA_DIR": "/srv/test", "CELERY_BROKER_URL": "redis://127.0.0.1:6379/11"}
    first, second = worker_environment(0, environ), worker_environment(1, environ)
    assert first == {"OGAI_DATA_DIR": "/srv/test/worker-0",
                     "CELERY_BROKER_URL": "redis://127.0.0.1:6379/11"}
    assert second == {"OGAI_DATA_DIR": "/srv/test/worker-1",
                      "CELERY_BROKER_URL": "redis://127.0.0.1:6379/12"}
    # The filesystem broker lives in the data folder: nothing more to change.
    assert worker_environment(1, {"OGAI_DATA_DIR": "/srv/test",
                                  "CELERY_BROKER_URL": "filesystem://"}) == {
        "OGAI_DATA_DIR": "/srv/test/worker-1"}


def test_workers_past_redis_last_database_are_refused_in_plain_words():
    with pytest.raises(pytest.UsageError, match="databases 15 to 16"):
        worker_environment(1, {"CELERY_BROKER_URL": "redis://127.0.0.1:6379/15"})


def test_the_files_of_one_shared_resource_are_one_unit_and_others_one_each():
    slurm = [path for path, resource in SHARED.items() if resource == "slurm"]
    assert len(slurm) > 1
    assert {unit_of(f"{path}::test_x[a::b]") for path in slurm} == {"slurm"}
    assert unit_of("tests/test_isolation.py::test_x[a::b]") == \
        "tests/test_isolation.py"
