"""Bare-metal servers and racks (platform admins only): list with bulk power actions behind a
confirmation, registration one by one or from a file, a server's page with its inventory, BMC
and history."""

from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from frontend.forms import add_service_errors
from frontend.forms_servers import (
    BMC_FIELD_MAP,
    BmcUpdateForm,
    RackForm,
    ServerImportForm,
    ServerRegisterForm,
    ServerUpdateForm,
)
from frontend.lists import list_response
from frontend.responses import safe_next
from frontend.tables_servers import RackTable, ServerTable
from infra_os.access import require_platform_admin
from infra_os.choices import PowerAction
from infra_os.filtersets import ServerFilterSet
from infra_os.selectors import provisioning_run_list, rack_list, server_list
from infra_os.server_files import parse_server_file
from infra_os.services.servers import (
    bmc_update,
    rack_create,
    rack_delete,
    server_delete,
    server_import,
    server_power_request,
    server_refresh_request,
    server_register,
    server_retire,
    server_update,
)

# The bulk actions of the server list: the power actions, and "Provision…" (the batch form).
PROVISION = "provision"
BULK_POWER_ACTIONS = (PowerAction.ON, PowerAction.OFF, PowerAction.CYCLE)
CSV_EXAMPLE = (
    "name,rack,bmc_address,bmc_username,bmc_password,expected_gpu_model,expected_gpu_count\n"
    "gpu-a01,rack-a,https://10.0.1.11,admin,secret-1,H100,8\n"
    "gpu-a02,rack-a,https://10.0.1.12,admin,secret-2,H100,8\n"
)
COLUMN_HELP = {
    "name": "required; lowercase letters, digits and hyphens",
    "rack": "a rack's name; a new one is added",
    "bmc_address": "required; the Redfish URL, e.g. https://10.0.1.11",
    "bmc_username": "required",
    "bmc_password": "required; stored encrypted",
    "system_id": "the Redfish system's id when the BMC manages several",
    "verify_tls": "true or false (default true)",
    "bmc_driver": "redfish (the default)",
    "expected_gpu_model": "e.g. H100",
    "expected_gpu_count": "a whole number (default 0)",
    "description": "free text",
    "boot_mac": "the NIC it network-boots from, aa:bb:cc:dd:ee:ff",
}


def _rack_names(request) -> list[str]:
    return list(rack_list(user=request.user).values_list("name", flat=True))


@login_required
def servers(request):
    require_platform_admin(request.user)
    return list_response(
        request,
        template="frontend/servers/list.html",
        table_class=ServerTable,
        queryset=server_list(user=request.user),
        filterset_class=ServerFilterSet,
        filter_labels={"q": "Search", "power_state": "Power", "mismatch": "Mismatch"},
        context={"bulk_actions": [(action.value, action.label) for action in
                                  BULK_POWER_ACTIONS]},
    )


@login_required
def server_register_view(request):
    require_platform_admin(request.user)
    form = ServerRegisterForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            server = server_register(actor=request.user, **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"Server {server.name} registered; its inventory is read "
                             "from the BMC in the background.")
            return redirect("frontend:server", name=server.name)
    return render(request, "frontend/servers/register.html",
                  {"form": form, "rack_names": _rack_names(request)})


@login_required
def server_import_view(request):
    """Register the servers of a CSV or JSON file: all of them, or none when a row is wrong."""
    require_platform_admin(request.user)
    form = ServerImportForm(request.POST or None, request.FILES or None)
    if request.method == "POST" and form.is_valid():
        upload = form.cleaned_data["file"]
        try:
            rows = parse_server_file(upload.read(), filename=upload.name)
            registered = server_import(actor=request.user, rows=rows)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"{len(registered)} server"
                             f"{'s' if len(registered) != 1 else ''} registered; their "
                             "inventories are read from their BMCs in the background.")
            return redirect("frontend:servers")
    return render(request, "frontend/servers/import.html", {
        "form": form,
        "columns": [(name, COLUMN_HELP.get(name, "")) for name in ServerImportForm.columns],
        "csv_example": CSV_EXAMPLE,
    })


@login_required
@require_POST
def server_bulk(request):
    """The server list's bulk actions. A power action first answers with a page naming the
    servers and the action; only its confirmed POST (confirmed=1) asks for it. "Provision…"
    opens the new-batch form with the servers chosen."""
    require_platform_admin(request.user)
    action = request.POST.get("action", "")
    names = list(dict.fromkeys(request.POST.getlist("servers")))
    back = safe_next(request, reverse("frontend:servers"))
    if not names:
        messages.error(request, "Choose at least one server first.")
        return HttpResponseRedirect(back)
    if action == PROVISION:
        return HttpResponseRedirect(
            f"{reverse('frontend:batch-create')}?{urlencode({'servers': names}, doseq=True)}")
    if action not in PowerAction.values:
        messages.error(request, f"Unknown action {action!r}.")
        return HttpResponseRedirect(back)
    chosen = list(server_list(user=request.user).filter(name__in=names).order_by("name"))
    unknown = sorted(set(names) - {server.name for server in chosen})
    label = PowerAction(action).label
    if unknown:
        messages.error(request, f"No such server: {', '.join(unknown)}.")
        return HttpResponseRedirect(back)
    error = ""
    if request.POST.get("confirmed") == "1":
        try:
            count = server_power_request(actor=request.user, servers=chosen, action=action)
        except ValidationError as exc:
            error = " ".join(exc.messages)
        else:
            messages.success(request, f"{label}: asked of {count} server"
                             f"{'s' if count != 1 else ''}. The BMCs are told in the "
                             "background; power states update as they answer.")
            return HttpResponseRedirect(back)
    return render(request, "frontend/servers/confirm_power.html", {
        "action": action, "action_label": label, "servers": chosen, "next": back,
        "error": error,
    }, status=400 if error else 200)


def _server_detail(request, server, *, edit_form=None, bmc_form=None, status=200):
    runs = provisioning_run_list(user=request.user).filter(server_id=server.pk) \
        .order_by("-pk")[:20]
    bmc = getattr(server, "bmc", None)  # a server made outside the services may have none
    context = {
        "server": server,
        "inventory": server.inventories.first(),
        "runs": runs,
        "leases": server.leases.select_related("tenant").order_by("-starts_at")[:20],
        "edit_form": edit_form or ServerUpdateForm(initial=ServerUpdateForm.initial_from(server)),
        "bmc": bmc,
        "bmc_form": bmc_form or (BmcUpdateForm(initial=BmcUpdateForm.initial_from(bmc))
                                 if bmc else None),
        "power_actions": [(action.value, action.label) for action in BULK_POWER_ACTIONS],
        "rack_names": _rack_names(request),
    }
    return render(request, "frontend/servers/detail.html", context, status=status)


def _get_server(request, name: str):
    # Others see no servers (the selector is empty for them): a 404, as for any hidden row.
    return get_object_or_404(server_list(user=request.user), name=name)


@login_required
def server_detail(request, name: str):
    server = _get_server(request, name)
    require_platform_admin(request.user)
    return _server_detail(request, server)


@login_required
@require_POST
def server_edit(request, name: str):
    server = _get_server(request, name)
    require_platform_admin(request.user)
    form = ServerUpdateForm(request.POST)
    if form.is_valid():
        try:
            server_update(actor=request.user, server=server, **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"{server.name} saved.")
            return redirect("frontend:server", name=server.name)
    return _server_detail(request, _get_server(request, name), edit_form=form, status=400)


@login_required
@require_POST
def server_bmc(request, name: str):
    server = _get_server(request, name)
    require_platform_admin(request.user)
    if getattr(server, "bmc", None) is None:
        messages.error(request, f"{server.name} has no BMC to change.")
        return redirect("frontend:server", name=server.name)
    form = BmcUpdateForm(request.POST)
    if form.is_valid():
        try:
            bmc_update(actor=request.user, server=server, **form.service_kwargs())
        except ValidationError as exc:
            add_service_errors(form, exc, BMC_FIELD_MAP)
        else:
            messages.success(request, f"{server.name}'s BMC settings saved; its inventory is "
                             "read again with them.")
            return redirect("frontend:server", name=server.name)
    return _server_detail(request, _get_server(request, name), bmc_form=form, status=400)


@login_required
@require_POST
def server_refresh(request, name: str):
    server = _get_server(request, name)
    require_platform_admin(request.user)
    server_refresh_request(actor=request.user, server=server)
    messages.success(request, f"Asked {server.name}'s BMC for its inventory; reload in a moment.")
    return redirect("frontend:server", name=server.name)


@login_required
@require_POST
def server_retire_view(request, name: str):
    server = _get_server(request, name)
    require_platform_admin(request.user)
    try:
        server_retire(actor=request.user, server=server)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"{server.name} retired: it is kept for the record and "
                         "offered for nothing.")
    return redirect("frontend:server", name=server.name)


@login_required
@require_POST
def server_delete_view(request, name: str):
    server = _get_server(request, name)
    require_platform_admin(request.user)
    try:
        server_delete(actor=request.user, server=server)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect("frontend:server", name=server.name)
    messages.success(request, f"Server {name} deleted.")
    return redirect("frontend:servers")


# Racks

def _racks_page(request, form, status: int = 200):
    return list_response(
        request,
        template="frontend/servers/racks.html",
        table_class=RackTable,
        queryset=rack_list(user=request.user),
        context={"form": form},
        status=status,
    )


@login_required
def racks(request):
    require_platform_admin(request.user)
    return _racks_page(request, RackForm())


@login_required
@require_POST
def rack_create_view(request):
    require_platform_admin(request.user)
    form = RackForm(request.POST)
    if form.is_valid():
        try:
            rack = rack_create(actor=request.user, **form.cleaned_data)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"Rack {rack.name} added.")
            return redirect("frontend:racks")
    return _racks_page(request, form, status=400)


@login_required
@require_POST
def rack_delete_view(request, name: str):
    rack = get_object_or_404(rack_list(user=request.user), name=name)
    require_platform_admin(request.user)
    count = rack.server_count
    rack_delete(actor=request.user, rack=rack)
    moved = "" if not count else "; its server is in no rack now" if count == 1 \
        else f"; its {count} servers are in no rack now"
    messages.success(request, f"Rack {name} deleted{moved}.")
    return redirect("frontend:racks")
