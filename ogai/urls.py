from django.contrib import admin
from django.http import HttpResponseRedirect, HttpResponseServerError
from django.shortcuts import render
from django.template.loader import render_to_string
from django.templatetags.static import static
from django.urls import include, path, re_path
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from ogai import health, metrics
from ogai.api.errors import json_error
from ogai.sign_in import ThrottledAdminAuthenticationForm, refused_with_429

admin.site.site_header = "OGAI administration"
admin.site.site_title = "OGAI admin"
admin.site.index_title = "Operators' administration"
# The admin's sign-in is throttled like the console's and the API's (ogai.sign_in).
admin.site.login_form = ThrottledAdminAuthenticationForm



def favicon(request):
    """Browsers ask for /favicon.ico on pages that name no icon (the API's, the admin's)."""
    return HttpResponseRedirect(static("frontend/favicon.svg"))


urlpatterns = [
    path("favicon.ico", favicon, name="favicon"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics_view, name="metrics"),
    # Before the admin's own URLs, so its sign-in page answers a refusal with a 429.
    path("admin/login/", refused_with_429(admin.site.login)),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    # Our template: drf-spectacular's loads Google's fonts; the docs are served offline.
    path("api/redoc/", SpectacularRedocView.as_view(
        url_name="api-schema", template_name="frontend/api_redoc.html"), name="api-redoc"),
    path("api/v1/infra-os/", include("infra_os.api.urls")),
    path("api/v1/podsys/", include("podsys.api.urls")),
    path("api/v1/aistation/", include("aistation.api.urls")),
    path("api/v1/ylink/", include("ylink.api.urls")),
    path("api/v1/mmodel/", include("mmodel.api.urls")),
    # Anything else under /api/ answers with the error envelope, in DEBUG too, whatever the
    # method: exempt from CSRF like the API's views, or a DELETE of a name no route matches
    # would get the CSRF failure page instead.
    re_path(r"^api/", csrf_exempt(lambda request, *args: handler404(request))),
    path("", include("frontend.urls")),
]


def _is_api(request) -> bool:
    return request.path.startswith("/api/")


def handler400(request, exception=None):
    if _is_api(request):
        return json_error("bad_request", str(exception) or "The request is not valid.", 400)
    return render(request, "frontend/error.html", {"status": 400, "title": "Bad request"},
                  status=400)


def handler403(request, exception=None):
    if _is_api(request):
        return json_error("permission_denied", "You may not do this.", 403)
    # A service's refusal says why ("Your role in demo is viewer; …"): show it.
    message = str(exception) if exception else ""
    return render(request, "frontend/error.html",
                  {"status": 403, "title": "Not allowed", "message": message}, status=403)


def handler404(request, exception=None):
    if _is_api(request):
        return json_error("not_found", f"Nothing at {request.path}.", 404)
    return render(request, "frontend/error.html", {"status": 404, "title": "Not found"},
                  status=404)


def handler500(request):
    if _is_api(request):
        return json_error("server_error", "The server failed; the error was logged.", 500)
    # No request context: the context processors may be what failed.
    return HttpResponseServerError(
        render_to_string("frontend/error.html", {"status": 500, "title": "Server error"})
    )
