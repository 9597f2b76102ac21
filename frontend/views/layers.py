"""Overview pages of the layers whose console pages do not exist yet (the toolchain and the
models): each says what the layer does and shows its (honest) empty state."""

from dataclasses import dataclass

from django.contrib.auth.decorators import login_required
from django.shortcuts import render


@dataclass(frozen=True)
class LayerOverview:
    layer: str
    app: str
    title: str
    summary: str
    empty_title: str
    empty_text: str


LAYERS = {
    "models": LayerOverview(
        "L4", "mmodel", "Models",
        "The model registry keeps every model version with its lineage to data and jobs, its "
        "evaluations and leaderboards. Deployed versions answer through the OpenAI-compatible "
        "gateway and the playground.",
        "No models are registered yet.",
        "Registered models appear here with their versions, evaluations and deployments.",
    ),
}


def layer_view(key: str):
    overview = LAYERS[key]

    @login_required
    def view(request):
        return render(request, "frontend/layers/overview.html", {"overview": overview})

    view.__name__ = f"{key}_overview"
    return view
