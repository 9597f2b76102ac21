"""The web console: server-rendered pages with htmx, one view serving a page and its partial."""
