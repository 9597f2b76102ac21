"""Overview pages of the layers above L0, which own no records yet: each says what the layer
does and shows its (honest) empty state."""

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
    "clusters": LayerOverview(
        "L1", "podsys", "Clusters",
        "Clusters are the compute OGAI runs work on: this machine through the local driver, or "
        "Kubernetes clusters built on leased servers. Each cluster lists its nodes and their "
        "GPUs, the software stack deployed on them, and node health and metrics.",
        "No clusters are registered yet.",
        "A registered cluster appears here with its nodes, GPUs and health.",
    ),
    "jobs": LayerOverview(
        "L2", "aistation", "Jobs",
        "Jobs are batch, distributed and long-running work that the scheduler places on "
        "clusters within your tenant's quota, by priority and fair share. Every job keeps its "
        "event history, so a waiting job always says why it waits.",
        "No jobs have been submitted yet.",
        "Submitted jobs, notebooks and their queues appear here with their state and logs.",
    ),
    "toolchain": LayerOverview(
        "L3", "ylink", "Toolchain",
        "The toolchain turns raw text into trained models: datasets, pipelines that clean, "
        "filter, deduplicate and tokenize them, and training recipes for pretraining, SFT and "
        "LoRA. Each step runs as a job, so it is scheduled, logged and resumed like any other.",
        "No datasets or training runs exist yet.",
        "Datasets, pipelines and training runs appear here with their progress and loss curves.",
    ),
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
