from django.contrib.auth.models import AnonymousUser
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions

from aistation.models import Job
from aistation.services.job_tokens import JOB_TOKEN_SCHEME, job_token_authenticate


class JobTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer ogj_…`, the token a job's runner got in its environment. The
    request acts as nobody: `request.auth` is the job."""

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if len(header) != 2 or header[0].lower() != b"bearer":
            return None
        secret = header[1].decode(errors="replace")
        if not secret.startswith(f"{JOB_TOKEN_SCHEME}_"):
            return None
        job = job_token_authenticate(secret)
        if job is None:
            raise exceptions.AuthenticationFailed(
                "The job token is unknown, or its job has ended.")
        return AnonymousUser(), job

    def authenticate_header(self, request):
        return 'Bearer realm="runner"'


class HasJobToken(permissions.BasePermission):
    def has_permission(self, request, view):
        return isinstance(request.auth, Job)


class JobTokenScheme(OpenApiAuthenticationExtension):
    target_class = "aistation.api.authentication.JobTokenAuthentication"
    name = "jobToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer",
                "description": "The job token a runner finds in OGAI_RUN_TOKEN."}
