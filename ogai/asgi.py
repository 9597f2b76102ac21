"""ASGI entry point: Django, plus the ASGI apps mounted beside it by path prefix.

`settings.OGAI_ASGI_MOUNTS` maps a path prefix to the dotted path of an ASGI application (e.g.
`{"/notebooks/": "aistation.proxy.application"}`, the notebooks' reverse proxy, which speaks
HTTP and WebSocket). HTTP and WebSocket connections whose path starts with a prefix go to that
application, with the scope unchanged; everything else (HTTP and `lifespan`) goes to Django.
Django serves no WebSockets: any other WebSocket handshake is refused (403).

The apps are imported by dotted path because `ogai` may not import the apps' packages
(an import-linter contract checks the layers).
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ogai.settings")
django_application = get_asgi_application()  # calls django.setup()

from django.conf import settings  # noqa: E402
from django.utils.module_loading import import_string  # noqa: E402

MOUNTS = [
    (prefix, import_string(path))
    for prefix, path in getattr(settings, "OGAI_ASGI_MOUNTS", {}).items()
]


async def application(scope, receive, send):
    if scope["type"] in ("http", "websocket"):
        for prefix, app in MOUNTS:
            if scope["path"].startswith(prefix):
                return await app(scope, receive, send)
        if scope["type"] == "websocket":
            if (await receive())["type"] == "websocket.connect":
                await send({"type": "websocket.close", "code": 1008})
            return None
    return await django_application(scope, receive, send)
