"""A cluster's POSIX accounts (platform admins only): users and groups with the same UID and
GID on every node, pushed by the accounts playbook, or an LDAP directory instead. Writes go
through podsys.services.accounts; a push is a deployment run, followed on its page."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST
from django_tables2 import RequestConfig

from frontend.forms import add_service_errors
from frontend.forms_podsys import ClusterGroupForm, ClusterLdapForm, ClusterUserForm
from frontend.tables_podsys import ClusterGroupTable, ClusterUserTable
from infra_os.access import require_platform_admin
from podsys.choices import DeploymentKind
from podsys.selectors import (
    cluster_account_list,
    cluster_group_list,
    cluster_list,
    deployment_run_list,
)
from podsys.services.accounts import (
    cluster_accounts_push,
    cluster_group_create,
    cluster_group_remove,
    cluster_ldap,
    cluster_ldap_set,
    cluster_user_create,
    cluster_user_remove,
)

# The recent pushes the page lists.
RECENT_PUSHES = 5


def _cluster(request, name: str):
    require_platform_admin(request.user)
    return get_object_or_404(cluster_list(user=request.user), name=name)


def _user_form(request, cluster, data=None) -> ClusterUserForm:
    groups = cluster_group_list(user=request.user, cluster=cluster).filter(is_active=True)
    return ClusterUserForm(data, groups=groups)


def _page(request, cluster, *, user_form=None, group_form=None, ldap_form=None):
    """The accounts page; a form given is one that came back with errors (status 400)."""
    users = cluster_account_list(user=request.user, cluster=cluster) \
        .select_related("cluster", "primary_group").prefetch_related("groups")
    groups = cluster_group_list(user=request.user, cluster=cluster).select_related("cluster")
    users_table = ClusterUserTable(users, prefix="u-")
    groups_table = ClusterGroupTable(groups, prefix="g-")
    for table in (users_table, groups_table):
        RequestConfig(request, paginate=False).configure(table)
    ldap = cluster_ldap(cluster)
    pushes = deployment_run_list(user=request.user, cluster=cluster) \
        .filter(kind=DeploymentKind.ACCOUNTS).order_by("-created_at", "-id")[:RECENT_PUSHES]
    failed = any(form is not None and form.errors for form in (user_form, group_form, ldap_form))
    return render(request, "frontend/podsys/accounts/page.html", {
        "cluster": cluster,
        "users_table": users_table,
        "groups_table": groups_table,
        "user_form": user_form or _user_form(request, cluster),
        "group_form": group_form or ClusterGroupForm(),
        "ldap_form": ldap_form or ClusterLdapForm(initial=ClusterLdapForm.initial_from(ldap)),
        "ldap": ldap or None,
        "pushes": list(pushes),
    }, status=400 if failed else 200)


@login_required
def cluster_accounts(request, name: str):
    return _page(request, _cluster(request, name))


@login_required
@require_POST
def cluster_user_create_view(request, name: str):
    cluster = _cluster(request, name)
    form = _user_form(request, cluster, request.POST)
    if form.is_valid():
        try:
            account = cluster_user_create(actor=request.user, cluster=cluster,
                                          **form.service_kwargs())
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"Account {account.username} (UID {account.uid}) added: "
                             "push to the nodes to create it there.")
            return redirect("frontend:cluster-accounts", name=cluster.name)
    return _page(request, cluster, user_form=form)


@login_required
@require_POST
def cluster_group_create_view(request, name: str):
    cluster = _cluster(request, name)
    form = ClusterGroupForm(request.POST)
    if form.is_valid():
        try:
            group = cluster_group_create(actor=request.user, cluster=cluster,
                                         **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"Group {group.name} (GID {group.gid}) added.")
            return redirect("frontend:cluster-accounts", name=cluster.name)
    return _page(request, cluster, group_form=form)


@login_required
@require_POST
def cluster_user_remove_view(request, name: str, pk: int):
    cluster = _cluster(request, name)
    account = get_object_or_404(cluster_account_list(user=request.user, cluster=cluster), pk=pk)
    try:
        cluster_user_remove(actor=request.user, account=account)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Account {account.username} removed: the next push deletes "
                         "it and its keys from every node.")
    return redirect("frontend:cluster-accounts", name=cluster.name)


@login_required
@require_POST
def cluster_group_remove_view(request, name: str, pk: int):
    cluster = _cluster(request, name)
    group = get_object_or_404(cluster_group_list(user=request.user, cluster=cluster), pk=pk)
    try:
        cluster_group_remove(actor=request.user, group=group)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Group {group.name} removed: the next push deletes it from "
                         "every node.")
    return redirect("frontend:cluster-accounts", name=cluster.name)


@login_required
@require_POST
def cluster_accounts_push_view(request, name: str):
    cluster = _cluster(request, name)
    try:
        run = cluster_accounts_push(actor=request.user, cluster=cluster)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect("frontend:cluster-accounts", name=cluster.name)
    count = len(run.hosts)
    messages.success(request, f"Pushing the accounts of {cluster.name} to {count} node"
                     f"{'s' if count != 1 else ''}.")
    return redirect("frontend:deployment-run", pk=run.pk)


@login_required
@require_POST
def cluster_ldap_view(request, name: str):
    cluster = _cluster(request, name)
    form = ClusterLdapForm(request.POST)
    if form.is_valid():
        try:
            cluster = cluster_ldap_set(actor=request.user, cluster=cluster, **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            uri = form.cleaned_data["uri"]
            messages.success(request, f"{cluster.name} now takes its accounts from {uri}: push "
                             "to the nodes to configure them." if uri else
                             f"{cluster.name} uses local accounts again: push to the nodes to "
                             "apply it.")
            return redirect("frontend:cluster-accounts", name=cluster.name)
    return _page(request, cluster, ldap_form=form)
