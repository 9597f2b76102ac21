"""API of MModel's registry: routes registered by mmodel/api/urls.py.

/models/ (list, create, retrieve; POST /models/{id}/import/), /model-imports/ (list,
retrieve), /model-versions/ (list, retrieve with files and lineage, DELETE, POST
/model-versions/register/ from a training run)."""

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.response import Response

from aistation.api.serializers import RejectUnknownFields, caller_tenant
from infra_os.api.serializers import CallerTenantField
from infra_os.api.viewsets import ScopedViewSet
from mmodel.filtersets import ModelFilterSet, ModelImportFilterSet, ModelVersionFilterSet
from mmodel.models import Model, ModelImport, ModelVersion
from mmodel.selectors.registry import imports_for, models_for, version_lineage, versions_for
from mmodel.services.registry import (
    model_create,
    model_import_start,
    version_delete,
    version_register_from_run,
)
from ylink.selectors import training_run_list

# Input ---------------------------------------------------------------------------------------


class ModelCreateSerializer(RejectUnknownFields, serializers.Serializer):
    tenant = CallerTenantField(required=False, help_text="Needed when you are in several.")
    name = serializers.CharField(max_length=100)
    description = serializers.CharField(allow_blank=True, default="", max_length=10000)

    def validate(self, attrs):
        attrs["tenant"] = caller_tenant(self.context["request"].user, attrs.get("tenant"),
                                        "create models in")
        return attrs


class ModelImportStartSerializer(RejectUnknownFields, serializers.Serializer):
    source_path = serializers.CharField(
        max_length=1000, help_text="An absolute path below an import root "
        "(OGAI_MODEL_IMPORT_ROOTS): a folder in Hugging Face layout (config.json, "
        "safetensors, tokenizer), or a .gguf file or a folder holding one.")
    allow_pickle = serializers.BooleanField(
        default=False, help_text="Import .bin/.pt weights too (they run code when loaded); "
        "also needs the operator's OGAI_MODEL_ALLOW_PICKLE.")


class ModelImportCreateSerializer(ModelImportStartSerializer):
    tenant = CallerTenantField(required=False, help_text="Needed when you are in several.")
    model = serializers.CharField(max_length=100, help_text="The model's name; a new model "
                                  "is created with the import (and only if it is accepted).")
    description = serializers.CharField(allow_blank=True, default="", max_length=10000)

    def validate(self, attrs):
        attrs["tenant"] = caller_tenant(self.context["request"].user, attrs.get("tenant"),
                                        "import models into")
        attrs["model_name"] = attrs.pop("model")
        return attrs


class VersionRegisterSerializer(RejectUnknownFields, serializers.Serializer):
    training_run = serializers.IntegerField(help_text="A finished training run's id.")
    model = serializers.CharField(max_length=100, help_text="The model's name in the run's "
                                  "tenant (created when missing).")
    description = serializers.CharField(allow_blank=True, default="", max_length=10000,
                                        help_text="The model's, when it is created.")

    def validate_training_run(self, value):
        run = training_run_list(user=self.context["request"].user).select_related(
            "dataset_version").filter(pk=value).first()
        if run is None:
            raise serializers.ValidationError("No such training run.")
        return run


# Output --------------------------------------------------------------------------------------


class LatestVersionSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    number = serializers.IntegerField()
    status = serializers.CharField()


class ModelSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="name", read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    versions = serializers.IntegerField(source="version_count", read_only=True)
    latest_version = serializers.SerializerMethodField()

    class Meta:
        model = Model
        fields = ["id", "name", "tenant", "description", "versions", "latest_version",
                  "created_by", "created_at"]

    @extend_schema_field(LatestVersionSerializer(allow_null=True))
    def get_latest_version(self, model) -> dict | None:
        if getattr(model, "latest_version_id", None) is None:
            return None
        return {"id": model.latest_version_id, "number": model.latest_version,
                "status": model.latest_version_status}


class ModelVersionSerializer(serializers.ModelSerializer):
    model = serializers.SlugRelatedField(slug_field="name", read_only=True)
    model_id = serializers.IntegerField(read_only=True)
    tenant = serializers.CharField(source="model.tenant.name", read_only=True)
    label = serializers.CharField(read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    training_run = serializers.PrimaryKeyRelatedField(read_only=True)
    base_version = serializers.PrimaryKeyRelatedField(read_only=True)
    dataset_versions = serializers.PrimaryKeyRelatedField(many=True, read_only=True)
    format = serializers.CharField(read_only=True, help_text="The weights as imported: "
                                   "safetensors, gguf or pickle (both converted to "
                                   "safetensors), or adapter (LoRA, safetensors).")

    class Meta:
        model = ModelVersion
        fields = ["id", "model", "model_id", "tenant", "number", "label", "status", "message",
                  "source", "format", "architecture", "model_type", "parameters",
                  "context_length", "dtype", "tokenizer", "bytes", "content_hash",
                  "training_run", "base_version", "dataset_versions", "created_by",
                  "created_at"]


class FileSerializer(serializers.Serializer):
    path = serializers.CharField()
    bytes = serializers.IntegerField()


class LineageNodeSerializer(serializers.Serializer):
    id = serializers.CharField(help_text="kind:pk")
    # Plain strings: an enum here would collide in the schema with other fields named kind.
    kind = serializers.CharField(help_text="dataset_version, pipeline_run, training_run or "
                                 "model_version.")
    label = serializers.CharField()
    pk = serializers.IntegerField()


class LineageSerializer(serializers.Serializer):
    nodes = LineageNodeSerializer(many=True)
    edges = serializers.ListField(child=serializers.ListField(child=serializers.CharField(),
                                                              min_length=2, max_length=2),
                                  help_text="[from id, to id]: what was used, what it made.")


class ModelVersionDetailSerializer(ModelVersionSerializer):
    files = FileSerializer(many=True, read_only=True)
    lineage = serializers.SerializerMethodField()

    class Meta(ModelVersionSerializer.Meta):
        fields = [*ModelVersionSerializer.Meta.fields, "source_path", "artifact_path", "files",
                  "lineage"]

    def get_lineage(self, version) -> dict:
        return version_lineage(version)


class ModelImportSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="name", read_only=True)
    model = serializers.SlugRelatedField(slug_field="name", read_only=True)
    model_id = serializers.IntegerField(read_only=True)
    version = serializers.PrimaryKeyRelatedField(read_only=True)
    version_number = serializers.IntegerField(source="version.number", read_only=True,
                                              allow_null=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = ModelImport
        fields = ["id", "tenant", "model", "model_id", "version", "version_number",
                  "source_path", "allow_pickle", "state", "message", "started_at",
                  "finished_at", "created_by", "created_at"]


# Views ---------------------------------------------------------------------------------------


class ModelViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Models of your tenants; import a folder to add a version."""

    selector = models_for
    output_serializer_class = ModelSerializer
    input_serializer_classes = {"create": ModelCreateSerializer,
                                "import_folder": ModelImportStartSerializer}
    filterset_class = ModelFilterSet

    @extend_schema(request=ModelCreateSerializer, responses={201: ModelSerializer})
    def create(self, request):
        model = model_create(actor=request.user, **self.validated_input())
        return self.respond(self.reload(model), http_status=status.HTTP_201_CREATED)

    @extend_schema(request=ModelImportStartSerializer, responses={202: ModelImportSerializer})
    @action(detail=True, methods=["post"], url_path="import", url_name="import")
    def import_folder(self, request, pk=None):
        model = self.get_object()
        job = model_import_start(actor=request.user, tenant=model.tenant,
                                 model_name=model.name, **self.validated_input())
        return self.respond(job, http_status=status.HTTP_202_ACCEPTED,
                            serializer=ModelImportSerializer)


class ModelImportViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Imports of model folders and how they went; start one into a model by name."""

    selector = imports_for
    output_serializer_class = ModelImportSerializer
    input_serializer_classes = {"create": ModelImportCreateSerializer}
    filterset_class = ModelImportFilterSet

    @extend_schema(request=ModelImportCreateSerializer, responses={202: ModelImportSerializer})
    def create(self, request):
        job = model_import_start(actor=request.user, **self.validated_input())
        return self.respond(job, http_status=status.HTTP_202_ACCEPTED)


class ModelVersionViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Versions of models: what they are, their files and lineage."""

    selector = versions_for
    output_serializer_class = ModelVersionSerializer
    input_serializer_classes = {"register": VersionRegisterSerializer}
    filterset_class = ModelVersionFilterSet
    tenant_field = "model__tenant"

    def get_serializer_class(self):
        if self.action == "retrieve":
            return ModelVersionDetailSerializer
        return super().get_serializer_class()

    @extend_schema(responses=ModelVersionDetailSerializer)
    def retrieve(self, request, pk=None):
        return self.respond(self.get_object(), serializer=ModelVersionDetailSerializer)

    @extend_schema(request=VersionRegisterSerializer,
                   responses={201: ModelVersionDetailSerializer})
    @action(detail=False, methods=["post"])
    def register(self, request):
        data = self.validated_input()
        version = version_register_from_run(actor=request.user, run=data["training_run"],
                                            model_name=data["model"],
                                            description=data["description"])
        return self.respond(self.reload(version), http_status=status.HTTP_201_CREATED,
                            serializer=ModelVersionDetailSerializer)

    @extend_schema(responses={204: None})
    def destroy(self, request, pk=None):
        version_delete(actor=request.user, version=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


ROUTES: list = [
    ("models", ModelViewSet, "model"),
    ("model-imports", ModelImportViewSet, "model-import"),
    ("model-versions", ModelVersionViewSet, "model-version"),
]
PATHS: list = []  # django.urls.path(...) entries
