"""The OpenAI-compatible gateway at /v1/ (an ASGI app mounted by ogai.asgi): `app` answers the
requests; `auth`, `routing`, `limits`, `usage` and `stats` hold its parts.

`application` is imported on first use, so `mmodel.gateway.stats` (read by the deployments'
selectors and the console) does not pull in the server side."""


def __getattr__(name: str):
    if name in ("application", "flush", "flush_sync"):
        from mmodel.gateway import app

        return getattr(app, name)
    raise AttributeError(name)
