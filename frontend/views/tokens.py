"""The user's own API tokens. A new token's secret goes through the session to the next page,
which shows it once and drops it."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from frontend.forms import ApiTokenCreateForm, add_service_errors
from frontend.lists import list_response
from frontend.responses import wants_partial
from frontend.tables import ApiTokenTable
from infra_os.filtersets import ApiTokenFilterSet
from infra_os.selectors import api_token_list
from infra_os.services.tokens import api_token_create, api_token_revoke

NEW_TOKEN_SESSION_KEY = "ogai_new_token"


def _own_tokens(request):
    # Platform admins see everyone's tokens through the selector; this page is about one's own.
    return api_token_list(user=request.user).filter(user_id=request.user.pk)


def _tokens_page(request, form, status: int = 200):
    # Only the full page shows (and so spends) a new secret; an htmx refresh leaves it.
    new_token = None if wants_partial(request) else request.session.pop(NEW_TOKEN_SESSION_KEY,
                                                                        None)
    return list_response(
        request,
        template="frontend/tokens/list.html",
        table_class=ApiTokenTable,
        queryset=_own_tokens(request),
        filterset_class=ApiTokenFilterSet,
        context={"form": form, "new_token": new_token},
        status=status,
    )


@never_cache
@login_required
def tokens(request):
    return _tokens_page(request, ApiTokenCreateForm())


@never_cache
@login_required
@require_POST
def token_create(request):
    form = ApiTokenCreateForm(request.POST)
    if form.is_valid():
        try:
            issued = api_token_create(actor=request.user, name=form.cleaned_data["name"],
                                      expires_at=form.expires_at())
        except ValidationError as exc:
            add_service_errors(form, exc, field_map={"expires_at": "expires_in_days"})
        else:
            request.session[NEW_TOKEN_SESSION_KEY] = {
                "name": issued.token.name, "secret": issued.secret,
            }
            return redirect("frontend:tokens")
    return _tokens_page(request, form)


@login_required
@require_POST
def token_revoke(request, pk: int):
    token = get_object_or_404(_own_tokens(request), pk=pk)
    api_token_revoke(actor=request.user, token=token)
    messages.success(request, f"Token {token.name} revoked; it no longer authenticates.")
    return redirect("frontend:tokens")
