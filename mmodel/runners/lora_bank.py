"""LoRA adapters of one base, each row of a batch with its own: the base's Linear layers that
adapters train are wrapped once, each holding every loaded adapter's two small matrices, and a
forward pass gives every row its adapter's change (or none, for a row of the base) in two
matrix products for the whole batch, as vLLM's multi-LoRA kernels do: no loop over adapters
and no copy of the rows per adapter, so a step of eight fine-tunes costs about what a step of
one does.

Adapters are PEFT folders (adapter_config.json and the weights), read with PEFT's own loaders:
LoRA on Linear layers, with rank and alpha patterns and rsLoRA; DoRA, biases on LoRA and
modules_to_save are refused with the reason.

torch and PEFT only: inlined into serve_pool's program where a cluster runs images.
"""

import functools
import math
from typing import Any

PREFIX = "base_model.model."  # how PEFT names the base's modules in an adapter's weights
STACKS_KEPT = 16  # sets of adapters used together whose stacked matrices each layer keeps


# Settings of an adapter (its adapter_config.json) that keep it from being applied per row.
UNBATCHED = (("use_dora", "DoRA"), ("modules_to_save", "modules_to_save"),
             ("lora_bias", "a bias on LoRA"))


class AdapterRefused(ValueError):
    """An adapter this bank cannot apply per row."""


def unbatched(config: dict) -> str | None:
    """What in an adapter's settings keeps it out of a pool, or None."""
    return next((why for key, why in UNBATCHED if config.get(key)), None)


@functools.cache
def _banked_linear():
    import torch

    class BankedLinear(torch.nn.Module):
        """A Linear layer of the base with the loaded adapters' changes to it."""

        def __init__(self, base, bank) -> None:
            super().__init__()
            self.base, self.bank = base, bank
            self.a: dict = {}  # adapter -> A (rank, in)
            self.b: dict = {}  # adapter -> B (out, rank), its scaling folded in
            self.stacked: dict = {}  # adapters used together -> their A and B side by side
            self.planned: Any = None
            self.down: Any = None  # the used adapters' A side by side (in, ranks)
            self.up: Any = None  # and their B (ranks, out)
            self.rows: Any = None  # which columns each row takes, or None: all

        def changed(self) -> None:
            self.stacked.clear()
            self.planned = None

        def prepare(self, plan: tuple, masks: dict) -> None:
            """The products for `plan` (each row's adapter, None for the base): the adapters
            it uses side by side, and which of their columns each row takes (`masks`: those
            already made for this plan, by the layout of the columns)."""
            self.planned = plan
            used = tuple(name for name in self.a if name in plan)
            if not used:
                self.down = None
                return
            if used not in self.stacked:
                if len(self.stacked) >= STACKS_KEPT:
                    self.stacked.pop(next(iter(self.stacked)))
                self.stacked[used] = (torch.cat([self.a[name] for name in used]).t(),
                                      torch.cat([self.b[name] for name in used], dim=1).t())
            self.down, self.up = self.stacked[used]
            if len(used) == 1 and all(name == used[0] for name in plan):
                self.rows = None  # every row takes the one adapter
                return
            layout = tuple((name, self.a[name].shape[0]) for name in used)
            if layout not in masks:
                owner = torch.tensor([used.index(name) if name in used else -1
                                      for name in plan], device=self.down.device)
                columns = torch.repeat_interleave(
                    torch.arange(len(used), device=self.down.device),
                    torch.tensor([rank for _, rank in layout], device=self.down.device))
                masks[layout] = (owner[:, None] == columns[None, :]).to(
                    self.down.dtype)[:, None, :]
            self.rows = masks[layout]

        def forward(self, x):
            out = self.base(x)
            plan = self.bank.plan
            if plan is None:
                return out
            if self.planned is not plan:
                self.prepare(plan, {})
            if self.down is None:
                return out
            low = torch.matmul(x.to(self.down.dtype), self.down)
            if self.rows is not None:
                low = low * self.rows
            return out + torch.matmul(low, self.up).to(out.dtype)

    return BankedLinear


class LoraBank:
    """The adapters loaded on one base model (changed in place: its adapted Linear layers are
    wrapped), and the plan of the next forward pass."""

    def __init__(self, model) -> None:
        self.model = model
        self.layers: dict = {}  # module path -> BankedLinear
        self.loaded: dict[str, list[str]] = {}  # adapter -> the module paths it changes
        self.plan: tuple | None = None

    def load(self, name: str, folder: str) -> None:
        from peft import LoraConfig
        from peft.utils import load_peft_weights
        from peft.utils.other import get_pattern_key

        config = LoraConfig.from_pretrained(folder)
        why = unbatched(config.to_dict())
        if why:
            raise AdapterRefused(f"adapter {name!r} uses {why}, which the pool runtime does "
                                 "not batch: serve it on its own deployment")
        weights = load_peft_weights(folder, device="cpu")
        pairs: dict[str, dict] = {}
        for key, tensor in weights.items():
            path, _, part = key.removeprefix(PREFIX).rpartition(".lora_")
            if part not in ("A.weight", "B.weight"):
                raise AdapterRefused(f"adapter {name!r} holds {key!r}: the pool runtime "
                                     "batches LoRA on Linear layers only")
            pairs.setdefault(path, {})[part[0]] = tensor
        changes = []  # checked for every layer before any is changed
        for path, pair in pairs.items():
            linear = self._linear(path, name)
            rank = pair["A"].shape[0]
            if pair["A"].shape[1] != linear.in_features or \
                    pair["B"].shape != (linear.out_features, rank):
                raise AdapterRefused(f"adapter {name!r} does not fit {path!r} of this base: it "
                                     "was trained on another model")
            alpha = config.alpha_pattern.get(get_pattern_key(config.alpha_pattern, path),
                                             config.lora_alpha)
            scaling = alpha / (math.sqrt(rank) if config.use_rslora else rank)
            changes.append((path, pair["A"], pair["B"] * scaling))
        for path, down, up in changes:
            layer = self._wrap(path)
            weight = layer.base.weight
            layer.a[name] = down.to(weight.device, weight.dtype)
            layer.b[name] = up.to(weight.device, weight.dtype)
            layer.changed()
        self.loaded[name] = list(pairs)

    def unload(self, name: str) -> None:
        for path in self.loaded.pop(name):
            layer = self.layers[path]
            layer.a.pop(name)
            layer.b.pop(name)
            layer.changed()

    def use(self, plan: list[str | None]) -> None:
        """The next forward passes' rows take these adapters (None: the base alone)."""
        rows = tuple(name if name in self.loaded else None for name in plan)
        if not any(rows):
            self.plan = None
        elif rows != self.plan:
            self.plan = rows
            masks: dict = {}
            for layer in self.layers.values():
                layer.prepare(rows, masks)

    def _linear(self, path: str, adapter: str):
        """The base's Linear layer at `path` (the one it was, where wrapped)."""
        import torch

        if path in self.layers:
            return self.layers[path].base
        try:
            module = self.model.get_submodule(path)
        except AttributeError:
            raise AdapterRefused(f"adapter {adapter!r} changes {path!r}, which this base does "
                                 "not have: it was trained on another model") from None
        if type(module) is not torch.nn.Linear:
            raise AdapterRefused(f"adapter {adapter!r} changes {path!r}, a "
                                 f"{type(module).__name__}: the pool runtime batches LoRA on "
                                 "Linear layers only")
        return module

    def _wrap(self, path: str):
        found = self.layers.get(path)
        if found is None:
            parent, _, child = path.rpartition(".")
            found = _banked_linear()(self.model.get_submodule(path), self)
            setattr(self.model.get_submodule(parent) if parent else self.model, child, found)
            self.layers[path] = found
        return found
