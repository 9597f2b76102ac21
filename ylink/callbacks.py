"""What YLink asks of the layers above it. They register a callback at start-up (in their
AppConfig.ready); YLink imports none of them.

`model_path`: the local folder of a registry model version a pipeline step names (the `hap`
step's `model`), resolved when the run is submitted so the runner gets a plain path. MModel
registers it; without MModel installed a step naming a model is refused.
"""

from collections.abc import Callable

__all__ = ["ModelNotFound", "model_path", "model_path_resolver_set"]


class ModelNotFound(LookupError):
    """The reference names no usable model version; the message says why, for a person."""


# resolver(*, actor, tenant, reference) -> absolute folder path; raises ModelNotFound
_model_path_resolver: Callable[..., str] | None = None


def model_path_resolver_set(resolver: Callable[..., str] | None) -> None:
    global _model_path_resolver
    _model_path_resolver = resolver


def model_path(*, actor, tenant, reference: str) -> str:
    """The folder of model version `reference` ("name:vN") of `tenant`, as `actor` sees it."""
    if _model_path_resolver is None:
        raise ModelNotFound("no model registry is installed to look models up in")
    return _model_path_resolver(actor=actor, tenant=tenant, reference=reference)
