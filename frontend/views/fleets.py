"""Fleets (platform admins only): the clusters a fleet's queues share out, each with its GPUs held
and whether its driver answers; the elastic pools that buy nodes for it, with their nodes booting,
idle and busy and their spend this month against the budget; and the autoscaler's decisions in
words. Read only: reads go through podsys.selectors_fleets."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.utils.cache import patch_vary_headers

from frontend.responses import wants_partial
from infra_os.access import require_platform_admin
from podsys.choices import ScaleEventKind
from podsys.selectors_fleets import fleet_list, fleet_summary

# How often the detail page asks for its clusters, pools and events again.
POLL_S = 10
EVENT_TONES = {ScaleEventKind.UP: "accent", ScaleEventKind.DOWN: "muted",
               ScaleEventKind.FAILED: "danger", ScaleEventKind.REFUSED: "warning"}


@login_required
def fleets(request):
    require_platform_admin(request.user)
    return render(request, "frontend/fleets/list.html", {
        "fleets": fleet_list(user=request.user).order_by("name"),
    })


@login_required
def fleet_detail(request, name: str):
    """The fleet's clusters, pools and scale events. An htmx request (the page's poller) gets
    that area alone."""
    require_platform_admin(request.user)
    fleet = get_object_or_404(fleet_list(user=request.user), name=name)
    summary = fleet_summary(fleet, timezone.now())
    context = {
        "fleet": fleet,
        "summary": summary,
        "events": [(event, EVENT_TONES.get(event.kind, "muted")) for event in summary.events],
        "lost": sum(1 for cluster in summary.clusters if cluster.lost),
        "poll_s": POLL_S,
    }
    template = "frontend/fleets/live.html" if wants_partial(request) \
        else "frontend/fleets/detail.html"
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))
    return response
