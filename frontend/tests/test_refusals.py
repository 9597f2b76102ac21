"""The console answers what a user got wrong as the user's doing: a refused action is a 403 or
400 page with the reason and one log line (who, what, why), never a traceback or a 500."""

import logging

import pytest
from django.core.exceptions import ValidationError
from django.urls import include, path, reverse

from tests.factories import ClusterFactory, JobFactory, QueueFactory

PAST_INT64 = "99999999999999999999"


def _job(world):
    queue = QueueFactory(tenant=world.alpha, cluster=ClusterFactory(name="farm"))
    return JobFactory(queue=queue, owner=world.alpha_member)


def test_a_refused_action_is_one_log_line_saying_who_what_and_why(signed_in, world, caplog):
    job = _job(world)
    caplog.set_level(logging.INFO)
    response = signed_in(world.alpha_viewer, world.alpha).post(
        reverse("frontend:job-cancel", kwargs={"pk": job.pk}))
    assert response.status_code == 403
    assert "Your role in alpha is viewer" in response.content.decode()
    logged = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert len(logged) == 1, [record.getMessage() for record in logged]
    line = logged[0]
    assert line.exc_info is None, "a refusal is not a crash: no traceback"
    message = line.getMessage()
    assert "\n" not in message
    assert f"POST /jobs/{job.pk}/cancel/" in message
    assert "alpha-viewer" in message
    assert "403" in message
    assert "Your role in alpha is viewer" in message
    job.refresh_from_db()
    assert job.state == "queued"


def _refuses_with_a_validation_error(request):
    raise ValidationError({"name": "A queue needs a name."})


urlpatterns = [path("refuses/", _refuses_with_a_validation_error),
               path("", include("frontend.urls"))]


@pytest.mark.urls("frontend.tests.test_refusals")
def test_a_validation_error_a_view_lets_through_is_a_400_not_a_500(signed_in, world, caplog):
    caplog.set_level(logging.INFO)
    client = signed_in(world.alpha_member, world.alpha)
    client.raise_request_exception = False
    response = client.post("/refuses/")
    assert response.status_code == 400
    assert "A queue needs a name." in response.content.decode()
    logged = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert [record.getMessage() for record in logged] == [
        "Refused POST /refuses/ for alpha-member (400): A queue needs a name."]
    assert logged[0].exc_info is None


def test_an_id_past_64_bits_on_a_console_list_is_no_filter_not_a_500(signed_in, world):
    client = signed_in(world.alpha_member, world.alpha)
    response = client.get(reverse("frontend:pipeline-runs"), {"dataset": PAST_INT64})
    assert response.status_code == 200
    response = client.get(reverse("frontend:pipeline-runs"), {"dataset": "1"})
    assert response.status_code == 200
