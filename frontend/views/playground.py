"""The playground (L4): chat with one deployed model, or two side by side, streamed from the
gateway by frontend/static/frontend/playground.js; after two answers, a vote that feeds the
arena's Elo ratings."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from frontend.access import console_access, current_tenant
from frontend.forms_mmodel import ArenaVoteForm
from frontend.views.deployments import current_deployments
from frontend.views.models import current_versions
from infra_os.choices import MODEL_CALL_ROLES
from mmodel.choices import DeploymentState
from mmodel.selectors.arena import arena_ratings
from mmodel.selectors.deployments import deployment_embeds, deployment_state
from mmodel.services.arena import arena_vote_record

# Deployments the gateway answers for: ready, or asleep and woken by the first request.
CHAT_STATES = {DeploymentState.READY, DeploymentState.DEGRADED, DeploymentState.SCALED_TO_ZERO}
RATINGS_TEMPLATE = "frontend/mmodel/playground/ratings.html"


@login_required
def playground(request):
    tenant = current_tenant(request)
    choices = []
    if tenant:
        for deployment in current_deployments(request).filter(active=True):
            state = deployment_state(deployment)
            if state in CHAT_STATES and not deployment_embeds(deployment):
                choices.append({"deployment": deployment, "state": state,
                                "asleep": state == DeploymentState.SCALED_TO_ZERO})
    return render(request, "frontend/mmodel/playground/playground.html", {
        "choices": choices,
        "ratings": arena_ratings(tenant=tenant) if tenant else [],
        "can_vote": console_access(request).can_write,
        # As the gateway decides it: the role in the tenant whose models these are.
        "can_chat": console_access(request).role in MODEL_CALL_ROLES,
    })


def _wants_fragment(request) -> bool:
    return bool(getattr(request, "htmx", None)) or \
        request.headers.get("X-Requested-With") == "playground"


@login_required
@require_POST
def arena_vote_view(request):
    """A vote on the two answers just shown; answers with the ratings table (for the page's
    script) or, for a plain form, goes back to the playground."""
    tenant = current_tenant(request)
    if not tenant:
        messages.error(request, "Choose a tenant first.")
        return redirect("frontend:playground")
    if not console_access(request).can_write:
        raise PermissionDenied("Viewers cannot vote.")
    form = ArenaVoteForm(request.POST, versions=current_versions(request))
    error = ""
    if form.is_valid():
        data = form.cleaned_data
        try:
            arena_vote_record(actor=request.user, tenant=tenant, left_version=data["left_version"],
                              right_version=data["right_version"], vote=data["vote"],
                              prompt=data["prompt"])
        except ValidationError as exc:
            error = " ".join(exc.messages)
    else:
        error = " ".join(f"{field.replace('_', ' ')}: {' '.join(errors)}"
                         for field, errors in form.errors.items())
    if not _wants_fragment(request):
        if error:
            messages.error(request, f"The vote was not recorded. {error}")
        else:
            messages.success(request, "Vote recorded.")
        return redirect("frontend:playground")
    return render(request, RATINGS_TEMPLATE, {
        "ratings": arena_ratings(tenant=tenant), "vote_error": error,
        "vote_recorded": not error,
    }, status=400 if error else 200)
