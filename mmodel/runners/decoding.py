"""Continuous batching on one model: the rows decoding together share each forward pass, and
a row joins or leaves between any two of them instead of waiting for a whole batch to end.

The rows keep one key/value cache, left-padded: a joining row's prompt is run alone (its
prefill), then its cache is padded on the left to the batch's width (or the batch's to its)
and stacked beside the others; the attention mask hides the padding and each row keeps its
own positions, so a row's tokens are what it would get alone. A row that ends is taken out,
and columns no row uses any more are cut from the left.

Each row carries its own sampling: greedy, or temperature and top-p with its own seed.

torch and transformers only: inlined into serve_pool's program where a cluster runs images.
"""

from collections.abc import Callable
from typing import Any


class Decoding:
    """The rows decoding on one model. A row is anything with `.pending` (its `prompt_ids`,
    `sampling` (temperature, top_p, seed), `done`), `add(token)` and `finish(reason)`."""

    def __init__(self, model, device: str, pad_id: int,
                 plan: Callable[[list], None] = lambda adapters: None) -> None:
        self.model, self.device, self.pad_id, self.plan = model, device, pad_id, plan
        self.limit = getattr(model.config, "max_position_embeddings", None) or 1 << 30
        self.rows: list = []
        self.adapters: list = []  # each row's adapter (None: the model itself)
        self.generators: list = []  # each sampling row's own
        # The batch's key/value cache, attention mask, next positions and next tokens.
        self.cache: Any = None
        self.mask: Any = None
        self.positions: Any = None
        self.next: Any = None

    def __len__(self) -> int:
        return len(self.rows)

    def join(self, rows: list, adapters: list) -> None:
        """Prefill the rows' prompts together, take each one's first token, and add them."""
        import torch

        with torch.inference_mode():
            self._join(rows, adapters)

    def _join(self, rows: list, adapters: list) -> None:
        # Each prompt is shorter than the model's context: the server refuses longer ones.
        import torch
        import torch.nn.functional as F
        from transformers import DynamicCache

        width = max(len(row.pending.prompt_ids) for row in rows)
        ids = torch.tensor([[self.pad_id] * (width - len(row.pending.prompt_ids))
                            + row.pending.prompt_ids for row in rows], device=self.device)
        mask = torch.tensor([[0] * (width - len(row.pending.prompt_ids))
                             + [1] * len(row.pending.prompt_ids) for row in rows],
                            device=self.device)
        cache: Any = DynamicCache()  # its layers: keys and values (batch, heads, columns, dim)
        self.plan(adapters)
        logits = self.model(input_ids=ids, attention_mask=mask,
                            position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                            cache=cache, use_cache=True,
                            logits_to_keep=1).logits[:, -1]
        generators = [self._generator(row) for row in rows]
        tokens = self._pick(logits, rows, generators)
        if self.cache is None:
            self.cache, self.mask = cache, mask
            self.positions, self.next = mask.sum(-1), tokens
        else:
            have = self.mask.shape[1]
            grown = max(have, width)
            for mine, theirs in zip(self.cache.layers, cache.layers, strict=True):
                mine.keys = torch.cat([F.pad(mine.keys, (0, 0, grown - have, 0)),
                                       F.pad(theirs.keys, (0, 0, grown - width, 0))])
                mine.values = torch.cat([F.pad(mine.values, (0, 0, grown - have, 0)),
                                         F.pad(theirs.values, (0, 0, grown - width, 0))])
            self.mask = torch.cat([F.pad(self.mask, (grown - have, 0)),
                                   F.pad(mask, (grown - width, 0))])
            self.positions = torch.cat([self.positions, mask.sum(-1)])
            self.next = torch.cat([self.next, tokens])
        self.rows += rows
        self.adapters += adapters
        self.generators += generators
        self._hand(rows, tokens)

    def step(self) -> None:
        """One more token for every row."""
        import torch

        with torch.inference_mode():
            self._step()

    def _step(self) -> None:
        import torch

        if not self.rows:
            return
        for row, position in zip(self.rows, self.positions.tolist(), strict=True):
            if position >= self.limit:
                row.finish("length")
        self.leave()
        if not self.rows:
            return
        self.plan(self.adapters)
        mask = torch.cat([self.mask, self.mask.new_ones(len(self.rows), 1)], dim=1)
        logits = self.model(input_ids=self.next[:, None], attention_mask=mask,
                            position_ids=self.positions[:, None], cache=self.cache,
                            use_cache=True).logits[:, -1]
        self.mask, self.positions = mask, self.positions + 1
        self.next = self._pick(logits, self.rows, self.generators)
        self._hand(self.rows, self.next)
        self.leave()

    def leave(self) -> None:
        """Take out the rows that ended, and the columns of the cache no row uses."""
        keep = [index for index, row in enumerate(self.rows) if not row.pending.done]
        if len(keep) == len(self.rows):
            return
        if not keep:
            self.rows, self.adapters, self.generators = [], [], []
            self.cache = self.mask = self.positions = self.next = None
            return
        import torch

        chosen = torch.tensor(keep, device=self.device)
        mask = self.mask.index_select(0, chosen)
        first = int(mask.any(0).int().argmax())  # the first column some row still uses
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, chosen)[:, :, first:]
            layer.values = layer.values.index_select(0, chosen)[:, :, first:]
        self.mask = mask[:, first:]
        self.positions = self.positions.index_select(0, chosen)
        self.next = self.next.index_select(0, chosen)
        self.rows = [self.rows[index] for index in keep]
        self.adapters = [self.adapters[index] for index in keep]
        self.generators = [self.generators[index] for index in keep]

    def fail(self, message: str) -> None:
        for row in self.rows:
            row.fail(message)
        self.leave()

    @staticmethod
    def _hand(rows: list, tokens) -> None:
        for row, token in zip(rows, tokens.tolist(), strict=True):
            row.add(int(token))

    def _generator(self, row):
        temperature, _, seed = row.pending.sampling
        if not temperature:
            return None
        import torch

        generator = torch.Generator(device=self.device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)
        return generator

    @staticmethod
    def _pick(logits, rows: list, generators: list):
        """Each row's next token: the likeliest, or drawn as its sampling says."""
        import torch

        tokens = logits.argmax(-1)
        for index, generator in enumerate(generators):
            if generator is None:
                continue
            temperature, top_p, _ = rows[index].pending.sampling
            probs = torch.softmax(logits[index].float() / temperature, -1)
            if top_p < 1:
                ordered, order = probs.sort(descending=True)
                # Keep the likeliest tokens until their mass reaches top_p (the first always).
                outside = ordered.cumsum(-1) - ordered >= top_p
                probs = probs.scatter(0, order[outside], 0.0)
            tokens[index] = torch.multinomial(probs, 1, generator=generator)[0]
        return tokens
