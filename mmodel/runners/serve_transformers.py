"""The transformers runtime's model server with a key in front: `transformers serve` with the
same options, its app answering only requests that carry `Authorization: Bearer <key>` (the key
from the environment variable OGAI_REPLICA_API_KEY); `GET /health` stays open for the
platform's readiness probe. transformers serve has no key option of its own, so this wraps the
app it builds, in the same process.

    python -m mmodel.runners.serve_transformers serve MODEL_DIR --host … --port …

With ATTACH_FLAG, MODEL_DIR is a prompt-tuning adapter (PEFT, never merged): it is loaded on
the base its adapter_config.json names, as PEFT's model, whose generate() prepends the prompt
(without continuous batching, which would run the base's forward alone). A multi-task prompt
serves one task: the one named by OGAI_PROMPT_TASK, else the first of its prompt_tasks.json.

Self-contained (transformers, PEFT for attached prompts, and the standard library only, with
`mmodel.runners.replica_guard`): where a cluster runs images, the platform hands the image's
`python -c` the guard's text and this file's.
"""

import json
import os
import sys

from mmodel.runners.replica_guard import guarded, take_key

ATTACH_FLAG = "--attach-prompt-adapter"
TASK_ENV = "OGAI_PROMPT_TASK"
PROMPT_PEFT_TYPES = ("PROMPT_TUNING", "MULTITASK_PROMPT_TUNING")


def prompt_task_index(folder: str, wanted: str) -> int:
    """The task id of `wanted` in the adapter's prompt_tasks.json (0 when none is wanted)."""
    try:
        with open(os.path.join(folder, "prompt_tasks.json")) as handle:
            tasks = json.load(handle).get("tasks") or []
    except (OSError, ValueError):
        tasks = []
    if not wanted:
        return 0
    if wanted not in tasks:
        sys.exit(f"{TASK_ENV}={wanted!r} is not a task of this prompt ({', '.join(tasks)})")
    return tasks.index(wanted)


def attach_prompt(base_model, folder: str, task: str = ""):
    """PEFT's model of the tuned prompt in `folder` on `base_model`, ready to generate. A
    multi-task prompt becomes the plain prompt of one task: its shared embedding scaled by
    that task's factors (what its forward computes for that task id)."""
    import torch
    from peft import PeftConfig, PeftModel, PromptTuningConfig, get_peft_model
    from peft.utils import load_peft_weights

    config = PeftConfig.from_pretrained(folder)
    if config.peft_type != "MULTITASK_PROMPT_TUNING":
        return PeftModel.from_pretrained(base_model, folder).eval()
    index = prompt_task_index(folder, task)
    weights = load_peft_weights(folder, device="cpu")
    factors = weights["prefix_task_cols"][index] @ weights["prefix_task_rows"][index]
    plain = PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=config.num_virtual_tokens,
                               token_dim=config.token_dim, num_layers=config.num_layers,
                               num_attention_heads=config.num_attention_heads,
                               num_transformer_submodules=config.num_transformer_submodules,
                               inference_mode=True)
    model = get_peft_model(base_model, plain)
    encoder = getattr(model.prompt_encoder["default"], "embedding")  # noqa: B009 - typed Any
    with torch.no_grad():
        encoder.weight.copy_(weights["prompt_embeddings"] * factors)
    return model.eval()


def _attach_prompts(manager_class) -> None:
    """transformers serve's model manager, loading a prompt adapter folder on its base."""
    load_model, load_processor = manager_class._load_model, manager_class._load_processor

    def adapter_config(model_id: str):
        path = os.path.join(model_id.split("@")[0], "adapter_config.json")
        if not os.path.isfile(path):
            return None
        with open(path) as handle:
            config = json.load(handle)
        return config if config.get("peft_type") in PROMPT_PEFT_TYPES else None

    def _load_model(self, model_id_and_revision, *args, **kwargs):
        config = adapter_config(model_id_and_revision)
        if config is None:
            return load_model(self, model_id_and_revision, *args, **kwargs)
        base = load_model(self, config["base_model_name_or_path"], *args, **kwargs)
        return attach_prompt(base, model_id_and_revision.split("@")[0],
                             os.environ.get(TASK_ENV, ""))

    def _load_processor(self, model_id_and_revision, *args, **kwargs):
        if adapter_config(model_id_and_revision) is None:
            return load_processor(self, model_id_and_revision, *args, **kwargs)
        from transformers import AutoTokenizer  # the adapter folder holds its tokenizer

        return AutoTokenizer.from_pretrained(model_id_and_revision.split("@")[0])

    manager_class._load_model, manager_class._load_processor = _load_model, _load_processor


def main() -> None:
    key = take_key()
    from transformers.cli.serving import server

    build = server.build_server
    # `transformers serve` looks build_server up when it starts: it gets the guarded app.
    server.build_server = lambda *args, **kwargs: guarded(build(*args, **kwargs), key)
    if ATTACH_FLAG in sys.argv:
        sys.argv.remove(ATTACH_FLAG)
        from transformers.cli.serving.model_manager import ModelManager

        _attach_prompts(ModelManager)
    from transformers.cli.transformers import main as cli

    cli()


if __name__ == "__main__":
    main()
