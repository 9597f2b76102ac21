"""Runners: the programs YLink starts inside platform jobs (`python -m ylink.runners.data`,
`python -m ylink.runners.train`). Nothing here imports Django or the platform's apps: these
modules also run in job containers that only have the toolchain's libraries."""


class DataError(Exception):
    """A failure of a run that the user can act on (bad input, bad spec); its message is one
    line that names the place (file and line, spec field)."""
