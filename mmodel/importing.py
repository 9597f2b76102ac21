"""Checking and reading a model folder for the registry: whether it may be imported at all
(nothing in it runs code), whether its weights fit its config and its tokenizer loads, and what
it is. Plain functions of paths (no database): the services pass in the operator's settings.

Nothing here passes `trust_remote_code`: a model that needs its own Python is refused."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# Any one of these makes a tokenizer (tokenizer.json alone, or a slow tokenizer's vocabulary).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model", "sentencepiece.bpe.model")
# Given to a tokenizer without one: `transformers serve` answers /v1/chat/completions only
# with a chat template.
PLAIN_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)
SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                      "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
                      "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
MAX_HEADER_BYTES = 100 * 2**20
LISTED_NAMES = 8


class ImportRefused(Exception):
    """What is wrong with a model folder, in words for the person who gave it."""


@dataclass
class Source:
    """A model to import: the folder read, its format, and the files taken from it."""

    folder: Path
    format: str  # safetensors | pickle | gguf
    files: list[str] = field(default_factory=list)  # relative to folder
    gguf_file: str = ""


@dataclass
class Description:
    """What a checked version folder holds."""

    architecture: str = ""
    model_type: str = ""
    parameters: int | None = None
    context_length: int | None = None
    dtype: str = ""
    tokenizer: str = ""
    notes: list[str] = field(default_factory=list)


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path == root or root in path.parents for root in roots)


def _names(items, limit: int = LISTED_NAMES) -> str:
    items = list(items)
    shown = ", ".join(str(item) for item in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def locate(source_path: str, roots: list[str]) -> Path:
    """The real path (links resolved) of what the user named, inside an import root."""
    if not source_path or not os.path.isabs(source_path):
        raise ImportRefused(f"Give an absolute path, not {source_path!r}.")
    if not roots:
        raise ImportRefused("Imports are switched off: OGAI_MODEL_IMPORT_ROOTS names no folder.")
    real = Path(os.path.realpath(source_path))
    allowed = [Path(os.path.realpath(root)) for root in roots]
    if not _inside(real, allowed):
        shown = source_path if str(real) == source_path else f"{source_path} (really {real})"
        raise ImportRefused(f"{shown} is outside the import roots: {', '.join(roots)}.")
    if not real.exists():
        raise ImportRefused(f"{source_path} does not exist.")
    return real


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ImportRefused(f"{path.name} is not readable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ImportRefused(f"{path.name} is not a JSON object.")
    return data


def _is_gguf(path: Path) -> bool:
    with path.open("rb") as stream:
        return stream.read(4) == b"GGUF"


def inspect(real: Path, *, roots: list[str], allow_pickle: bool,
            pickle_allowed: bool) -> Source:
    """Refuse what may not be imported (code, pickle unless both the request and the operator
    allow it, no config, no tokenizer); say what is to be read. Reads file names and small
    JSON files only."""
    if real.is_file():
        if real.suffix.lower() != ".gguf":
            raise ImportRefused(f"{real.name} is a file: give a model folder, or a .gguf file.")
        if not _is_gguf(real):
            raise ImportRefused(f"{real.name} is not a GGUF file (no GGUF signature).")
        # Only the named file is read; nothing else in its folder matters.
        return Source(folder=real.parent, format="gguf", files=[real.name], gguf_file=real.name)
    allowed = [Path(os.path.realpath(root)) for root in roots]
    files = sorted(path for path in real.rglob("*") if path.is_file())
    names = [str(path.relative_to(real)) for path in files]
    # Hidden folders (.git, .cache of a hub download) are not part of the model.
    kept = [(path, name) for path, name in zip(files, names, strict=True)
            if not any(part.startswith(".") for part in Path(name).parts)]
    for path, name in kept:
        if not _inside(Path(os.path.realpath(path)), allowed):
            raise ImportRefused(f"{name} links outside the import roots "
                                f"({os.path.realpath(path)}).")
    code = [name for _, name in kept if name.endswith(".py")]
    if code:
        raise ImportRefused(f"{code[0]} is Python code: models that bring their own code "
                            "(trust_remote_code) are not imported.")
    for config_name in ("config.json", "tokenizer_config.json"):
        if (real / config_name).is_file() and _json(real / config_name).get("auto_map"):
            raise ImportRefused(f"{config_name} names code of its own (auto_map): models that "
                                "bring their own code (trust_remote_code) are not imported.")
    top = {name for _, name in kept if "/" not in name}
    ggufs = sorted(name for name in top if name.lower().endswith(".gguf"))
    if "config.json" not in top:
        if len(ggufs) == 1:
            return inspect(real / ggufs[0], roots=roots, allow_pickle=allow_pickle,
                           pickle_allowed=pickle_allowed)
        if len(ggufs) > 1:
            raise ImportRefused(f"The folder holds several GGUF files ({_names(ggufs)}): name "
                                "the one to import.")
        if "adapter_config.json" in top:
            raise ImportRefused("This is a LoRA adapter (adapter_config.json, no config.json): "
                                "register it from its training run, beside its base model.")
        raise ImportRefused("No config.json: give a folder in Hugging Face layout (config.json, "
                            "weights, tokenizer) or a .gguf file.")
    pickles = [name for _, name in kept if name.lower().endswith(PICKLE_SUFFIXES)]
    if pickles and not (allow_pickle and pickle_allowed):
        who = ("set allow_pickle on the import as well" if pickle_allowed
               else "an operator must set OGAI_MODEL_ALLOW_PICKLE")
        raise ImportRefused(f"{pickles[0]} holds pickle weights: pickle weights run code when "
                            f"loaded; {who}.")
    weights = [name for name in top if name.endswith(".safetensors")]
    if not weights and not pickles:
        raise ImportRefused("No weights: no *.safetensors file beside config.json.")
    if not top & set(TOKENIZER_FILES):
        raise ImportRefused(f"No tokenizer: the folder needs tokenizer.json, or tokenizer.model "
                            f"or vocabulary files ({', '.join(TOKENIZER_FILES[1:])}).")
    fmt = "safetensors" if weights else "pickle"
    # Pickle files beside safetensors are never read: leave them out.
    taken = [name for _, name in kept
             if not name.lower().endswith((*PICKLE_SUFFIXES, ".gguf")) or fmt == "pickle"]
    return Source(folder=real, format=fmt, files=taken)


def copy_files(source: Source, target: Path) -> None:
    """Copy the source's files (their contents, never links) into `target`."""
    for name in source.files:
        destination = target / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source.folder / name, destination)


# Weights -------------------------------------------------------------------------------------

def safetensors_header(path: Path) -> dict[str, dict]:
    """Tensor name -> {"dtype", "shape", "data_offsets"}, read from the header only; a file
    too short for the tensors it declares is refused."""
    size = path.stat().st_size
    with path.open("rb") as stream:
        head = stream.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < length <= min(MAX_HEADER_BYTES, size - 8):
            raise ImportRefused(f"{path.name} is not a safetensors file.")
        try:
            header = json.loads(stream.read(length))
        except ValueError:
            raise ImportRefused(f"{path.name} has a damaged safetensors header.") from None
    header.pop("__metadata__", None)
    end = max((int(entry["data_offsets"][1]) for entry in header.values()), default=0)
    if 8 + length + end > size:
        raise ImportRefused(f"{path.name} is truncated: its tensors need {8 + length + end} "
                            f"bytes, the file has {size}.")
    return header


def weight_tensors(folder: Path, *, prefix: str = "model") -> dict[str, dict]:
    """Every tensor of the folder's weights (one file, or shards with their index)."""
    index = folder / f"{prefix}.safetensors.index.json"
    tensors: dict[str, dict] = {}
    if index.is_file():
        weight_map = _json(index).get("weight_map") or {}
        headers: dict[str, dict] = {}
        for shard in sorted(set(weight_map.values())):
            if not (folder / shard).is_file():
                raise ImportRefused(f"{index.name} names the shard {shard}, which is missing.")
            headers[shard] = safetensors_header(folder / shard)
        absent = [name for name, shard in weight_map.items() if name not in headers[shard]]
        if absent:
            raise ImportRefused(f"{index.name} lists tensors its shards lack: {_names(absent)}.")
        for header in headers.values():
            tensors.update(header)
        return tensors
    files = sorted(folder.glob(f"{prefix}*.safetensors"))
    if not files:
        raise ImportRefused(f"No {prefix}.safetensors in the folder.")
    for path in files:
        tensors.update(safetensors_header(path))
    return tensors


def weights_dtype(tensors: dict[str, dict]) -> str:
    counts = Counter(entry["dtype"] for entry in tensors.values())
    if not counts:
        return ""
    found = counts.most_common(1)[0][0]
    return SAFETENSORS_DTYPES.get(found, found.lower())


def parameter_count(tensors: dict[str, dict]) -> int:
    total = 0
    for entry in tensors.values():
        count = 1
        for dim in entry["shape"]:
            count *= int(dim)
        total += count
    return total


def _model_class(config):
    import transformers

    architectures = getattr(config, "architectures", None) or []
    for name in architectures:
        found = getattr(transformers, name, None)
        if found is not None:
            return found
    if architectures:
        raise ImportRefused(f"transformers {transformers.__version__} has no architecture "
                            f"{architectures[0]}.")
    return transformers.AutoModelForCausalLM


def _meta_model(folder: Path):
    """The model its config describes, with no memory behind its tensors."""
    import torch
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ImportRefused(f"config.json does not load: {exc}") from None
    cls = _model_class(config)
    try:
        with torch.device("meta"):
            return config, cls._from_config(config)
    except Exception as exc:  # any failure to build is the config's fault
        raise ImportRefused(f"The model of config.json cannot be built: {exc}") from None


def _compare(expected: dict[str, tuple], found: dict[str, tuple], *, tied: set[str],
             ignore_missing: list[str], ignore_unexpected: list[str]) -> list[str]:
    def ignored(name: str, patterns: list[str]) -> bool:
        return any(re.search(pattern, name) for pattern in patterns)

    missing = sorted(name for name in expected.keys() - found.keys()
                     if name not in tied and not ignored(name, ignore_missing))
    unexpected = sorted(name for name in found.keys() - expected.keys()
                        if not ignored(name, ignore_unexpected))
    mismatched = sorted(f"{name} (file {list(found[name])}, model {list(expected[name])})"
                        for name in expected.keys() & found.keys()
                        if tuple(found[name]) != tuple(expected[name]))
    problems = []
    if missing:
        problems.append(f"missing tensors: {_names(missing)}")
    if unexpected:
        problems.append(f"unexpected tensors: {_names(unexpected)}")
    if mismatched:
        problems.append(f"tensors of the wrong shape: {_names(mismatched)}")
    return problems


def check_weights(folder: Path) -> tuple[Any, dict[str, dict]]:
    """The config and the tensors of a safetensors model folder, once the tensors' names and
    shapes match the model its config builds (on the meta device: no weights are read)."""
    tensors = weight_tensors(folder)
    config, model = _meta_model(folder)
    expected = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    found = {name: tuple(entry["shape"]) for name, entry in tensors.items()}
    prefix = getattr(model, "base_model_prefix", "")
    if prefix and not found.keys() & expected.keys():
        # Saved from the bare base model (no head): its names lack the prefix.
        found = {f"{prefix}.{name}": shape for name, shape in found.items()}
    # A buffer the model no longer saves (BERT's position_ids) is dropped on load, as
    # transformers drops it.
    buffers = [f"^{re.escape(name)}$" for name, _ in model.named_buffers()]
    problems = _compare(
        expected, found, tied=set(getattr(model, "all_tied_weights_keys", {}) or {}),
        ignore_missing=list(model._keys_to_ignore_on_load_missing or []),
        ignore_unexpected=[*(model._keys_to_ignore_on_load_unexpected or []), *buffers])
    if problems:
        raise ImportRefused("The weights do not fit config.json: " + "; ".join(problems) + ".")
    return config, tensors


def check_adapter(folder: Path, base_folder: Path) -> dict[str, dict]:
    """The tensors of a LoRA adapter, once they match what its config makes of the base
    model (both on the meta device)."""
    import torch
    from peft import PeftConfig, get_peft_model, get_peft_model_state_dict

    if not (folder / "adapter_config.json").is_file():
        raise ImportRefused("The adapter has no adapter_config.json.")
    tensors = weight_tensors(folder, prefix="adapter_model")
    _, base = _meta_model(base_folder)
    try:
        peft_config = PeftConfig.from_pretrained(str(folder))
        with torch.device("meta"):
            model = get_peft_model(base, peft_config)
    except Exception as exc:  # a config peft cannot apply to the base is the adapter's fault
        raise ImportRefused(f"adapter_config.json does not apply to the base model: {exc}") \
            from None
    expected = {name: tuple(tensor.shape)
                for name, tensor in get_peft_model_state_dict(model).items()}
    found = {name: tuple(entry["shape"]) for name, entry in tensors.items()}
    problems = _compare(expected, found, tied=set(), ignore_missing=[], ignore_unexpected=[])
    if problems:
        raise ImportRefused("The adapter does not fit its base model: " + "; ".join(problems)
                            + ".")
    return tensors


# Tokenizer -----------------------------------------------------------------------------------

def check_tokenizer(folder: Path) -> tuple[str, list[str]]:
    """The tokenizer's class once it loads (giving it a plain chat template when it has
    none), and notes on what was changed."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # any failure to load is the tokenizer files' fault
        raise ImportRefused(f"The tokenizer does not load: {exc}") from None
    notes = []
    # A sentence-embedding model (modules.json) is never chatted with: its files stay as they are.
    if not getattr(tokenizer, "chat_template", None) and not (folder / "modules.json").is_file():
        tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
        tokenizer.save_pretrained(str(folder))
        notes.append("The tokenizer had no chat template: it was given a plain one "
                     "(\"role: content\" lines), which chat endpoints need.")
    return type(tokenizer).__name__, notes


# GGUF ----------------------------------------------------------------------------------------

def convert_gguf(source: Source, target: Path) -> list[str]:
    """Dequantise a GGUF file into a safetensors model folder with its tokenizer. Saved in the
    dtype the loaded config names (float32: GGUF is dequantised to it, and these CPUs have no
    bfloat16 arithmetic)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(source.folder), source.gguf_file
    try:
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                      local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    except Exception as exc:  # unsupported architecture, damaged file: the file's fault
        raise ImportRefused(f"{name} does not load: {exc}") from None
    config = loaded.config
    # save_pretrained refuses a model loaded from GGUF (it counts as quantised): build a plain
    # one from the same config and move the weights over.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    dtype = getattr(config, "dtype", None) or torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    with torch.device("meta"):
        plain = type(loaded)._from_config(config, dtype=dtype)
    plain.load_state_dict(loaded.state_dict(), assign=True)
    plain.tie_weights()
    del loaded
    plain.to(dtype)
    plain.save_pretrained(str(target))
    tokenizer.save_pretrained(str(target))
    return [f"Converted from {name} (dequantised) to safetensors in {str(dtype)[6:]}."]


def convert_pickle(source: Source, target: Path) -> list[str]:
    """Load pickle weights (the operator allowed it) and save them as safetensors, so nothing
    unpickles them again."""
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(str(target), local_files_only=True,
                                                     use_safetensors=False)
    except Exception as exc:  # damaged or mismatched weights: the files' fault
        raise ImportRefused(f"The pickle weights do not load: {exc}") from None
    for name in source.files:
        if name.lower().endswith(PICKLE_SUFFIXES):
            (target / name).unlink()
    model.save_pretrained(str(target))
    return ["Converted from pickle weights to safetensors."]


# Describing ----------------------------------------------------------------------------------

def context_length_of(config) -> int | None:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = getattr(text, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def describe(config, tensors: dict[str, dict]) -> Description:
    architectures = getattr(config, "architectures", None) or []
    return Description(
        architecture=architectures[0] if architectures else "",
        model_type=getattr(config, "model_type", "") or "",
        parameters=parameter_count(tensors),
        context_length=context_length_of(config),
        dtype=weights_dtype(tensors),
    )


def prepare_model(source: Source, staging: Path, progress=print) -> Description:
    """Fill `staging` with the model in safetensors layout (unless the source is already
    there) and check it: weights fit the config, the tokenizer loads (with a chat template).
    Raises ImportRefused."""
    notes: list[str] = []
    if source.format == "gguf":
        progress(f"converting {source.gguf_file} to safetensors")
        notes += convert_gguf(source, staging)
    else:
        if source.folder.resolve() != staging.resolve():
            progress(f"copying {len(source.files)} files")
            copy_files(source, staging)
        if source.format == "pickle":
            progress("converting pickle weights to safetensors")
            notes += convert_pickle(source, staging)
    progress("checking the weights against config.json")
    config, tensors = check_weights(staging)
    progress("loading the tokenizer")
    tokenizer, tokenizer_notes = check_tokenizer(staging)
    description = describe(config, tensors)
    description.tokenizer = tokenizer
    description.notes = notes + tokenizer_notes
    return description
