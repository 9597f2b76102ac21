"""Import a model folder or GGUF file as a new version, here and now (no worker needed):
`manage.py import_model --tenant demo --name smollm2-135m-instruct /path/to/folder`."""

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.http import Http404

from infra_os.models import Tenant
from mmodel.choices import ImportState, VersionStatus
from mmodel.models import ModelVersion
from mmodel.services.registry import model_import_create, model_import_run


class Command(BaseCommand):
    help = ("Import a model folder (Hugging Face layout, safetensors) or a .gguf file below an "
            "import root as a new version of a tenant's model, synchronously.")

    def add_arguments(self, parser):
        parser.add_argument("path", help="An absolute path below OGAI_MODEL_IMPORT_ROOTS.")
        parser.add_argument("--tenant", required=True)
        parser.add_argument("--name", required=True, help="The model's name (created when "
                            "missing).")
        parser.add_argument("--allow-pickle", action="store_true",
                            help="Import .bin/.pt weights too (needs OGAI_MODEL_ALLOW_PICKLE).")
        parser.add_argument("--if-missing", action="store_true",
                            help="Do nothing when the model already has a ready version.")
        parser.add_argument("--user", default="", help="Who imports (default: the first "
                            "platform admin).")

    def handle(self, *args, path, tenant, name, allow_pickle, if_missing, user, **options):
        users = get_user_model().objects.filter(is_active=True)
        actor = (users.filter(username=user) if user else
                 users.filter(is_staff=True).order_by("pk")).first()
        if actor is None:
            raise CommandError(f"No user {user!r}." if user else
                               "No platform admin yet: run `manage.py seed_demo` first.")
        found = Tenant.objects.filter(name=tenant).first()
        if found is None:
            raise CommandError(f"No tenant {tenant!r}.")
        ready = ModelVersion.objects.filter(model__tenant=found, model__name=name,
                                            status=VersionStatus.READY).first()
        if if_missing and ready is not None:
            self.stdout.write(f"{ready.label} is already there ({ready.artifact_path}).")
            return
        try:
            job = model_import_create(actor=actor, tenant=found, model_name=name,
                                      source_path=path, allow_pickle=allow_pickle)
        except ValidationError as error:
            raise CommandError("; ".join(error.messages)) from None
        except (PermissionDenied, Http404):
            raise CommandError(f"{actor.username} may not import into {tenant}.") from None
        self.stdout.write(f"Importing {path} as {name} v{job.version.number} "
                          f"(import {job.pk})")
        job = model_import_run(import_id=job.pk,
                               progress=lambda step: self.stdout.write(f"  {step}"))
        if job.state != ImportState.SUCCEEDED:
            raise CommandError(f"Import failed: {job.message}")
        version = job.version
        self.stdout.write(
            f"Ready: {version.label} ({version.architecture}, {version.parameters:,} "
            f"parameters, {version.dtype}, context {version.context_length}, "
            f"{version.bytes / 2**20:.1f} MiB, sha256 {version.content_hash[:12]}) in "
            f"{version.artifact_path}")
        if version.message:
            self.stdout.write(f"  {version.message}")
