"""Requests no client should send get a 400 in the error envelope, never a 500: ids past what
the database holds, JSON nested thousands deep, bodies of countless fields, fields no input
has. Each was a 500 (or silently ignored) before."""

import django_filters
import pytest
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.test.client import BOUNDARY, MULTIPART_CONTENT, encode_multipart
from django.urls import get_resolver

from aistation.models import Queue
from frontend.forms import ClusterCreateForm
from infra_os.models import Tenant
from infra_os.server_files import parse_server_file
from mmodel.services.evaluation import benchmarks_seed_builtin
from ogai import json_input
from ogai.api.errors import envelope
from ogai.filters import FilterSet
from podsys.models import Cluster
from tests.factories import ClusterFactory, QueueFactory

APPS = ("infra_os", "podsys", "aistation", "ylink", "mmodel", "frontend")
PAST_INT64 = "99999999999999999999"
DEEP = "[" * 5000 + "]" * 5000

# Routes whose integer filters overflowed SQLite (OverflowError, a 500).
ID_FILTERS = [
    "/api/v1/ylink/dataset-versions/?dataset=",
    "/api/v1/ylink/pipeline-runs/?dataset=",
    "/api/v1/podsys/health-checks/?node=",
    "/api/v1/mmodel/evaluation-runs/?version=",
    "/api/v1/mmodel/evaluation-runs/?benchmark=",
    "/api/v1/mmodel/model-versions/?model=",
    "/api/v1/mmodel/model-imports/?model=",
]


def _schema(client) -> dict:
    response = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    return response.json()


def _refused(response, code, field=None):
    assert response.status_code == 400, response.content
    body = response.json()
    assert set(body) == {"code", "message", "fields"}
    assert body["code"] == code, body
    if field:
        assert field in body["fields"], body
    return body


@pytest.mark.parametrize("url", ID_FILTERS)
def test_an_id_filter_past_64_bits_is_a_400_naming_the_filter(api, world, url):
    name = url.rsplit("?", 1)[1].rstrip("=")
    response = api.as_user(world.alpha_member).get(url + PAST_INT64)
    body = _refused(response, "invalid", name)
    assert "9223372036854775807" in body["fields"][name][0]


def test_an_id_filter_still_filters(api, world):
    response = api.as_user(world.alpha_member).get("/api/v1/ylink/dataset-versions/?dataset=1")
    assert response.status_code == 200
    assert response.json()["results"] == []


def _filtersets():
    assert get_resolver().url_patterns  # imports every view, so every FilterSet in use

    def below(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from below(sub)

    return [cls for cls in below(django_filters.FilterSet)
            if cls.__module__.split(".")[0] in APPS]


def test_every_filterset_has_the_bounded_base():
    """A FilterSet added later on django_filters' own base would bring the overflow back."""
    found = _filtersets()
    assert len(found) > 20
    strays = [f"{cls.__module__}.{cls.__name__}" for cls in found
              if not issubclass(cls, FilterSet)]
    assert strays == [], "derive these from ogai.filters.FilterSet"


def test_a_model_choice_filter_past_64_bits_is_invalid_too(world):
    """Safe already (Django's own guard on a primary key lookup): kept so it stays so."""
    class QueueByCluster(FilterSet):
        cluster = django_filters.ModelChoiceFilter(queryset=Cluster.objects)

        class Meta:
            model = Queue
            fields = ["cluster"]

    QueueFactory(tenant=world.alpha)
    filters = QueueByCluster({"cluster": PAST_INT64}, queryset=Queue.objects.all())
    assert not filters.is_valid()
    assert "cluster" in filters.errors
    assert filters.qs.count() == 1


def test_the_schema_says_id_filters_are_64_bit_integers(api, world):
    paths = _schema(api.as_user(world.alpha_member))["paths"]
    operation = paths["/api/v1/ylink/dataset-versions/"]["get"]
    dataset = next(p for p in operation["parameters"] if p["name"] == "dataset")
    assert dataset["schema"]["type"] == "integer"
    assert dataset["schema"]["maximum"] == 2**63 - 1


def test_the_format_filter_filters_instead_of_choosing_a_renderer(api, world):
    """`?format=` was DRF's renderer switch, so filtering versions by format was a 404."""
    response = api.as_user(world.alpha_member).get("/api/v1/ylink/dataset-versions/?format=jsonl")
    assert response.status_code == 200, response.content
    response = api.as_user(world.alpha_member).get("/api/v1/mmodel/model-versions/?format=gguf")
    assert response.status_code == 200, response.content


# -- JSON nested too deep --------------------------------------------------------------------


def test_json_nested_5000_deep_is_a_400(api, world):
    response = api.as_user(world.alpha_member).post("/api/v1/ylink/datasets/", DEEP,
                                                    content_type="application/json")
    body = _refused(response, "parse_error")
    assert f"nested deeper than {json_input.MAX_DEPTH} levels" in body["message"]


@pytest.mark.parametrize("url", ["/api/v1/infra-os/auth/login/",
                                 "/api/v1/infra-os/provisioning/callback/"])
def test_json_nested_5000_deep_is_a_400_without_signing_in(api, db, url):
    response = api.post(url, DEEP, content_type="application/json")
    _refused(response, "parse_error")


def test_json_deeper_than_the_limit_but_parseable_is_refused_too(api, world):
    """Just under the interpreter's recursion limit it parses, and whatever walks it next
    would recurse as deep."""
    nested = "[" * 500 + "]" * 500
    response = api.as_user(world.alpha_member).post("/api/v1/ylink/datasets/",
                                                    f'{{"name": "x", "description": {nested}}}',
                                                    content_type="application/json")
    _refused(response, "parse_error")


def test_json_within_the_limit_is_read(api, world):
    nested = "[" * (json_input.MAX_DEPTH - 1) + "]" * (json_input.MAX_DEPTH - 1)
    assert json_input.loads(f'{{"a": {nested}}}') is not None
    response = api.as_user(world.alpha_member).post(
        "/api/v1/ylink/datasets/", {"tenant": "alpha", "name": "corpus"}, format="json")
    assert response.status_code == 201, response.content


def test_an_uploaded_jsonl_document_nested_too_deep_is_refused(api, world, settings, tmp_path):
    settings.DATA_DIR = tmp_path
    client = api.as_user(world.alpha_member)
    dataset = client.post("/api/v1/ylink/datasets/", {"tenant": "alpha", "name": "corpus"},
                          format="json").json()
    upload = SimpleUploadedFile("deep.jsonl", ('{"text": ' + DEEP + "}\n").encode())
    response = client.post(f"/api/v1/ylink/datasets/{dataset['id']}/upload/",
                           {"file": upload}, format="multipart")
    body = _refused(response, "invalid", "file")
    assert "nested deeper" in body["fields"]["file"][0]


def test_a_benchmark_document_nested_too_deep_is_refused(api, world, settings, tmp_path):
    settings.DATA_DIR = tmp_path
    upload = SimpleUploadedFile("deep.jsonl", ('{"text": ' + DEEP + "}\n").encode())
    response = api.as_user(world.alpha_member).post(
        "/api/v1/mmodel/benchmarks/", {"tenant": "alpha", "name": "deep", "kind": "perplexity",
                                       "file": upload}, format="multipart")
    body = _refused(response, "invalid", "file")
    assert "nested deeper" in body["fields"]["file"][0]


def test_cluster_options_nested_too_deep_are_a_form_error(world):
    form = ClusterCreateForm({"name": "deep", "driver": "fake", "options": DEEP},
                             drivers=["fake"], tenants=Tenant.objects.all())
    assert not form.is_valid()
    assert "nested deeper" in form.errors["options"][0]


def test_a_server_file_nested_too_deep_is_refused():
    with pytest.raises(ValidationError, match="nested deeper"):
        parse_server_file(DEEP.encode(), filename="servers.json")


# -- countless fields --------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["/api/v1/aistation/jobs/", "/api/v1/ylink/datasets/"])
def test_a_multipart_body_of_1001_fields_is_a_400(api, world, url):
    fields = {f"field{i}": "x" for i in range(1001)}
    response = api.as_user(world.alpha_member).post(
        url, encode_multipart(BOUNDARY, fields), content_type=MULTIPART_CONTENT)
    body = _refused(response, "too_many_fields")
    assert "1000" in body["message"]


def test_a_multipart_body_of_101_files_is_a_400(api, world):
    files = {f"file{i}": SimpleUploadedFile(f"{i}.jsonl", b"{}\n") for i in range(101)}
    response = api.as_user(world.alpha_member).post(
        "/api/v1/ylink/datasets/", encode_multipart(BOUNDARY, files),
        content_type=MULTIPART_CONTENT)
    _refused(response, "too_many_files")


def test_a_form_body_of_1001_fields_is_a_400(api, world):
    form = "&".join(f"field{i}=x" for i in range(1001))
    response = api.as_user(world.alpha_member).post(
        "/api/v1/aistation/jobs/", form, content_type="application/x-www-form-urlencoded")
    _refused(response, "too_many_fields")


# -- unknown fields -------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["patch", "put"])
def test_an_unknown_field_in_an_update_is_refused_like_in_a_create(api, world, method):
    queue = QueueFactory(tenant=world.alpha, name="default")
    before = Queue.objects.filter(pk=queue.pk).values().get()
    response = getattr(api.as_user(world.alpha_admin), method)(
        f"/api/v1/aistation/queues/{queue.pk}/", {"default_priorty": 5, "description": "x"},
        format="json")
    body = _refused(response, "invalid", "default_priorty")
    assert body["fields"] == {"default_priorty": ["Unknown field."]}
    assert Queue.objects.filter(pk=queue.pk).values().get() == before


def test_an_unknown_field_is_refused_in_every_app(api, world):
    """Also where the input serializers never refused one (infra_os, podsys)."""
    client = api.as_user(world.operator)
    response = client.patch("/api/v1/infra-os/tenants/alpha/", {"display_nam": "A"},
                            format="json")
    _refused(response, "invalid", "display_nam")
    assert Tenant.objects.get(name="alpha").display_name == "Alpha"
    response = client.post("/api/v1/infra-os/tenants/", {"name": "gamma", "quota_gpu": 8},
                           format="json")
    _refused(response, "invalid", "quota_gpu")
    assert not Tenant.objects.filter(name="gamma").exists()


def test_a_known_field_in_an_update_still_applies(api, world):
    queue = QueueFactory(tenant=world.alpha, name="default")
    response = api.as_user(world.alpha_admin).patch(
        f"/api/v1/aistation/queues/{queue.pk}/", {"default_priority": 3}, format="json")
    assert response.status_code == 200, response.content
    assert Queue.objects.get(pk=queue.pk).default_priority == 3


# -- the schema says what is answered ----------------------------------------------------------


def test_shared_rows_answer_null_where_the_schema_says_nullable(api, world, settings, tmp_path):
    settings.DATA_DIR = tmp_path
    benchmarks_seed_builtin()
    ClusterFactory(name="shared", tenant=None)
    client = api.as_user(world.alpha_member)
    components = _schema(client)["components"]["schemas"]
    benchmark = client.get("/api/v1/mmodel/benchmarks/").json()["results"][0]
    assert benchmark["created_by"] is None
    assert components["Benchmark"]["properties"]["created_by"]["nullable"] is True
    cluster = client.get("/api/v1/podsys/clusters/shared/").json()
    assert cluster["tenant"] is None
    assert components["Cluster"]["properties"]["tenant"]["nullable"] is True


def test_the_deployment_state_enum_is_mmodels_own(api, world):
    """PODsys' deployment runs and MModel's deployments both had a `DeploymentStateEnum`: the
    schema listed the runs' states for a model deployment, which answers `starting`."""
    components = _schema(api.as_user(world.alpha_member))["components"]["schemas"]
    assert "starting" in components["DeploymentStateEnum"]["enum"]
    assert "queued" in components["DeploymentRunStateEnum"]["enum"]


def test_errors_are_documented_in_the_envelope(api, world):
    schema = _schema(api.as_user(world.alpha_member))
    responses = schema["paths"]["/api/v1/ylink/datasets/{id}/"]["get"]["responses"]
    assert {"200", "400", "401", "403", "404"} <= set(responses)
    assert responses["404"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Error"}
    assert set(schema["components"]["schemas"]["Error"]["required"]) == set(
        envelope("x", "y"))


def test_an_unknown_api_url_answers_the_envelope_to_any_method(db):
    """A DELETE of a name no route matches got Django's CSRF failure page (HTML): the
    catch-all of /api/ was the one view there not exempt from CSRF, like the API's are."""
    client = Client(enforce_csrf_checks=True)
    for method in ("post", "put", "patch", "delete"):
        response = getattr(client, method)("/api/v1/infra-os/racks/%C3%88/",
                                           HTTP_AUTHORIZATION="Bearer ogai_x_y")
        assert response.status_code == 404, (method, response.content[:80])
        assert response.json()["code"] == "not_found"
