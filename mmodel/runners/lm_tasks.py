"""Benchmarks kept by the platform compiled into lm-eval task YAML over local JSONL files.

One task per benchmark, named `ogai_b<id>`, its data by absolute path (`dataset_path: json`), so
lm-eval reads nothing from the network. Few-shot examples are drawn from the other documents
of the same file (the benchmark is not split: small uploaded suites would lose too much).
Imports no Django: the platform compiles at launch, and the runner and tests read the result.
"""

from pathlib import Path
from typing import Any

import yaml

# Generation answers are compared after dropping leading whitespace and taking the first
# answer (a model that answers " 7" to "3 + 4 =" is right).
GENERATION_FILTER = "strip"
FILTERS = {"multiple_choice": "none", "generation": GENERATION_FILTER, "perplexity": "none"}


def task_name(benchmark_id: int) -> str:
    return f"ogai_b{benchmark_id}"


def task_config(benchmark: dict[str, Any]) -> dict[str, Any]:
    """The lm-eval task of a benchmark: {"id", "kind", "data_file" (absolute),
    "prompt_template", "target_template", "choices_template", "text_field", "few_shot",
    "metrics", "generation_kwargs"}."""
    data_file = str(Path(benchmark["data_file"]).resolve())
    kind = benchmark["kind"]
    config: dict[str, Any] = {
        "task": task_name(benchmark["id"]),
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": data_file}},
        "test_split": "test",
    }
    few_shot = int(benchmark.get("few_shot") or 0)
    if few_shot:
        # The same split by name: only then does lm-eval leave the document being asked out
        # of its examples (a second split over the same file would show it its own answer).
        config["fewshot_split"] = "test"
        config["num_fewshot"] = few_shot
    metrics = benchmark["metrics"]
    if kind == "multiple_choice":
        config.update({
            "output_type": "multiple_choice",
            "doc_to_text": benchmark["prompt_template"],
            "doc_to_target": benchmark["target_template"],
            "doc_to_choice": benchmark["choices_template"],
            "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True}
                            for m in metrics],
        })
    elif kind == "generation":
        config.update({
            "output_type": "generate_until",
            "doc_to_text": benchmark["prompt_template"],
            "doc_to_target": benchmark["target_template"],
            "generation_kwargs": dict(benchmark.get("generation_kwargs") or {}),
            "filter_list": [{"name": GENERATION_FILTER, "filter": [
                {"function": "remove_whitespace"}, {"function": "take_first"}]}],
            "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True}
                            for m in metrics],
        })
    elif kind == "perplexity":
        config.update({
            "output_type": "loglikelihood_rolling",
            "doc_to_text": "",
            "doc_to_target": benchmark["text_field"],
            "metric_list": [{"metric": m, "aggregation": (
                "bits_per_byte" if m == "bits_per_byte" else "weighted_perplexity"),
                "higher_is_better": False} for m in metrics],
        })
    else:
        raise ValueError(f"unknown benchmark kind {kind!r}")
    return config


def write_tasks(benchmarks: list[dict[str, Any]], folder: Path) -> list[dict[str, Any]]:
    """Write one YAML file per benchmark into `folder`; what the runner needs to know of each
    task: [{"task", "benchmark", "kind", "filter"}]."""
    folder.mkdir(parents=True, exist_ok=True)
    tasks = []
    for benchmark in benchmarks:
        config = task_config(benchmark)
        path = folder / f"{config['task']}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
        tasks.append({"task": config["task"], "benchmark": benchmark["id"],
                      "kind": benchmark["kind"], "filter": FILTERS[benchmark["kind"]]})
    return tasks
