"""Kinds `prompt_tuning` and `multitask_prompt_tuning`: PEFT's PromptTuningConfig and
MultitaskPromptTuningConfig on a frozen base, trained by the same loop as LoRA.

A tuned prompt is `num_virtual_tokens` embeddings prepended to every input. The multi-task
variant (Wang et al. 2023) shares one prompt and gives each task a rank-`num_ranks` factor
(cols x rows) that scales it element-wise; its forward needs `task_ids`, one task index per
example, read from the instruction dataset's optional task column (`metadata.task`). The task
names in id order are saved beside the adapter (TASKS_FILE), so evaluation and serving can pick
a task by name.

Stage 2 of the multi-task recipe starts a target prompt from a source run's adapter (PEFT's
AVERAGE_SOURCE_TASKS, EXACT_SOURCE_TASK, ONLY_SOURCE_SHARED, reading the source's
`adapter_model.safetensors`). Once trained, the weights are the prompt: the saved
adapter_config.json says RANDOM and names no source file, so the adapter loads anywhere
(resume, registry, evaluation, serving) without the source's folder; TASKS_FILE keeps where it
started from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ylink.runners.training.runtime import TrainError

KINDS = ("prompt_tuning", "multitask_prompt_tuning")
TASKS_FILE = "prompt_tasks.json"
DEFAULT_TASK = "default"  # the task of a record without a task column
SOURCE_INITS = {"average_source_tasks", "exact_source_task", "only_source_shared"}
# Config fields that only matter while the prompt is first built.
_INIT_ONLY = {"prompt_tuning_init": "RANDOM", "prompt_tuning_init_state_dict_path": None,
              "prompt_tuning_init_task": 0, "tokenizer_name_or_path": None}


def read_tasks(adapter: Path) -> dict[str, Any]:
    """What TASKS_FILE says of an adapter folder ({} when it has none)."""
    path = Path(adapter) / TASKS_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def task_names(kind: str, settings: dict[str, Any], found: list[str | None]) -> list[str]:
    """The tasks in id order: `prompt_tuning.tasks` when given (every task of the data must be
    in it), else the data's task names sorted. Plain prompt tuning has none."""
    if kind == "prompt_tuning":
        return []
    present = sorted({task or DEFAULT_TASK for task in found})
    given = settings.get("tasks")
    if given is None:
        return present
    missing = [task for task in present if task not in given]
    if missing:
        raise TrainError(f"the data has tasks {', '.join(missing)} that prompt_tuning.tasks "
                         f"does not name", exit_code=2)
    return list(given)


def read_source(settings: dict[str, Any]) -> dict[str, Any] | None:
    """The source multi-task adapter a stage-2 init reads, checked."""
    if settings.get("init") not in SOURCE_INITS:
        return None
    folder = Path(settings["source_adapter_path"])
    config_path, weights = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    if not config_path.is_file() or not weights.is_file():
        raise TrainError(f"prompt_tuning.source_adapter_path {folder} holds no saved adapter "
                         f"(adapter_config.json and adapter_model.safetensors)", exit_code=2)
    config = json.loads(config_path.read_text())
    if config.get("peft_type") != "MULTITASK_PROMPT_TUNING":
        raise TrainError(f"prompt_tuning.source_adapter_path {folder} is a "
                         f"{config.get('peft_type')} adapter, not a multi-task prompt",
                         exit_code=2)
    tasks = read_tasks(folder).get("tasks") or []
    index = 0
    if settings["init"] == "exact_source_task":
        if settings["source_task"] not in tasks:
            raise TrainError(f"prompt_tuning.source_task {settings['source_task']!r} is not a "
                             f"task of the source ({', '.join(tasks) or 'none saved'})",
                             exit_code=2)
        index = tasks.index(settings["source_task"])
    return {"path": str(folder), "weights": str(weights), "tasks": tasks, "task_index": index,
            "num_virtual_tokens": int(config["num_virtual_tokens"]),
            "num_ranks": int(config.get("num_ranks") or 1)}


def virtual_tokens(settings: dict[str, Any], source: dict[str, Any] | None) -> int:
    # A stage-2 prompt has the source's shape (PEFT loads the source strictly).
    return source["num_virtual_tokens"] if source else int(settings["num_virtual_tokens"])


def peft_config(kind: str, settings: dict[str, Any], *, base: Path, tasks: list[str],
                source: dict[str, Any] | None):
    from peft import MultitaskPromptTuningConfig, PromptTuningConfig, TaskType

    init = settings["init"]
    common: dict[str, Any] = {
        "task_type": TaskType.CAUSAL_LM,
        "num_virtual_tokens": virtual_tokens(settings, source),
        "prompt_tuning_init": init.upper(),
    }
    if init == "text":
        common |= {"prompt_tuning_init_text": settings["init_text"],
                   "tokenizer_name_or_path": str(base)}
    if kind == "prompt_tuning":
        return PromptTuningConfig(**common)
    extra: dict[str, Any] = {"num_tasks": len(tasks),
                             "num_ranks": source["num_ranks"] if source else
                             int(settings["num_ranks"])}
    if source:
        if init != "only_source_shared" and len(tasks) != 1:
            # PEFT loads one averaged (or picked) source task into the target's factors.
            raise TrainError(f"init {init} starts one target task; the data has "
                             f"{len(tasks)} ({', '.join(tasks)})", exit_code=2)
        extra |= {"prompt_tuning_init_state_dict_path": source["weights"],
                  "prompt_tuning_init_task": source["task_index"]}
    return MultitaskPromptTuningConfig(**common, **extra)


def describe(kind: str, settings: dict[str, Any], tasks: list[str],
             source: dict[str, Any] | None) -> dict[str, Any]:
    """TASKS_FILE's content."""
    about: dict[str, Any] = {"kind": kind, "tasks": tasks, "init": settings["init"],
                             "num_virtual_tokens": virtual_tokens(settings, source)}
    if source:
        about["source"] = {"path": source["path"], "tasks": source["tasks"]}
        if settings["init"] == "exact_source_task":
            about["source"]["task"] = settings["source_task"]
    return about


def finish_folder(directory: Path, about: dict[str, Any]) -> None:
    """After PEFT's save_pretrained: the config made self-contained, the tasks beside it."""
    config_path = directory / "adapter_config.json"
    config = json.loads(config_path.read_text())
    for key, value in _INIT_ONLY.items():
        if key in config:
            config[key] = value
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (directory / TASKS_FILE).write_text(json.dumps(about, indent=1) + "\n")
