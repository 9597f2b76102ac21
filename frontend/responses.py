"""The page-or-partial choice the console views share."""


def wants_partial(request) -> bool:
    """An htmx request for the table area; a history restore needs the whole page."""
    htmx = getattr(request, "htmx", None)
    return bool(htmx) and not htmx.history_restore_request
