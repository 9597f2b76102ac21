"""Every API route the project registers, found by walking the URL resolver, so tests that loop
over them cover routes added later without anyone listing them."""

import re
from dataclasses import dataclass, field

from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.viewsets import ViewSetMixin


@dataclass
class ViewSetRoutes:
    viewset: type
    namespace: str
    basename: str
    list_name: str | None = None
    list_methods: set[str] = field(default_factory=set)
    # url name → HTTP methods, for routes that take the object's lookup value
    detail_routes: dict[str, set[str]] = field(default_factory=dict)
    # url name → the other values a detail route takes (e.g. a pool member's name)
    detail_kwargs: dict[str, list[str]] = field(default_factory=dict)
    # url name → HTTP methods, for actions on the collection
    list_actions: dict[str, set[str]] = field(default_factory=dict)


@dataclass
class PlainRoute:
    view: type
    name: str


def _walk(patterns, namespace: str, regex: str):
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            inner = namespace
            if pattern.namespace:
                inner = f"{namespace}:{pattern.namespace}" if namespace else pattern.namespace
            yield from _walk(pattern.url_patterns, inner, regex + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            yield namespace, regex + str(pattern.pattern), pattern


def api_routes() -> tuple[list[ViewSetRoutes], list[PlainRoute]]:
    viewsets: dict[type, ViewSetRoutes] = {}
    plain: list[PlainRoute] = []
    for namespace, regex, pattern in _walk(get_resolver().url_patterns, "", ""):
        if not regex.startswith("api/v1/") or not pattern.name:
            continue
        callback = pattern.callback
        cls = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
        if cls is None:
            continue
        full_name = f"{namespace}:{pattern.name}" if namespace else pattern.name
        if isinstance(cls, type) and issubclass(cls, ViewSetMixin):
            basename = pattern.name.rsplit("-", 1)[0]
            if pattern.name.endswith("-list"):
                basename = pattern.name[: -len("-list")]
            routes = viewsets.setdefault(cls, ViewSetRoutes(cls, namespace, basename))
            methods = {method.upper() for method in callback.actions}
            if "(?P<" in str(pattern.pattern):
                routes.detail_routes[full_name] = methods
                routes.detail_kwargs[full_name] = list(re.compile(
                    str(pattern.pattern)).groupindex)
            elif pattern.name.endswith("-list"):
                routes.list_name = full_name
                routes.list_methods = methods
            else:  # an action on the collection, e.g. servers/power/
                routes.list_actions[full_name] = methods
        else:
            plain.append(PlainRoute(cls, full_name))
    return list(viewsets.values()), plain
