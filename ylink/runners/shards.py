"""Token shards: the built-in byte tokenizer and reading `tokenize` output back.

A token dataset version is a directory of datatrove `DocumentTokenizer` output: for each shard
`NAME.ds` (tokens, little-endian uint16 or uint32, every document ending with EOS) and
`NAME.ds.index` (uint64 end offset of each document, in tokens), plus `tokenizer.json` and
`meta.json` ({"seq_len", "eos_id", "vocab_size", "token_size", "documents", "tokens"}).
"""

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

__all__ = [
    "EOS_TOKEN",
    "byte_tokenizer",
    "decode_documents",
    "iter_shard_documents",
    "load_meta",
    "load_tokenizer",
    "shard_arrays",
    "shard_files",
]

EOS_TOKEN = "<|endoftext|>"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (what ByteLevel uses)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars), strict=True))


def byte_tokenizer():
    """A tokenizer with one token per byte (id = byte value) and `<|endoftext|>` = 256.

    ByteLevel pre-tokenizer and decoder, BPE over the 256 byte symbols with no merges: any text
    round-trips, and nothing is downloaded."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: byte for byte, char in _bytes_to_unicode().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(EOS_TOKEN, special=True, normalized=False)])
    return tokenizer


def load_tokenizer(path: str | Path):
    """A tokenizers.Tokenizer from a tokenizer.json file or a directory holding one."""
    from tokenizers import Tokenizer

    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    return Tokenizer.from_file(str(path))


def load_meta(directory: str | Path) -> dict:
    return json.loads((Path(directory) / "meta.json").read_text())


def shard_files(directory: str | Path) -> list[Path]:
    """The shard files (`*.ds`) of a token dataset, in a fixed order."""
    return sorted(Path(directory).glob("*.ds"))


def _token_dtype(directory: Path) -> np.dtype:
    meta_path = directory / "meta.json"
    size = json.loads(meta_path.read_text())["token_size"] if meta_path.exists() else None
    if size is None:  # fall back on datatrove's own "<tokenizer>|<size>" metadata line
        for metadata in directory.glob("*.ds.metadata"):
            size = int(metadata.read_text().splitlines()[0].rsplit("|", 1)[1])
            break
    return np.dtype("<u4") if size == 4 else np.dtype("<u2")


def shard_arrays(directory: str | Path) -> list[np.ndarray]:
    """Each shard's tokens as a read-only memory map (documents back to back, EOS-terminated)."""
    directory = Path(directory)
    dtype = _token_dtype(directory)
    arrays = []
    for path in shard_files(directory):
        if path.stat().st_size == 0:
            arrays.append(np.zeros(0, dtype=dtype))
        else:
            arrays.append(np.memmap(path, dtype=dtype, mode="r"))
    return arrays


def iter_shard_documents(directory: str | Path) -> Iterator[list[int]]:
    """Each document's token ids (ending with EOS), shard by shard, in stored order."""
    directory = Path(directory)
    dtype = _token_dtype(directory)
    for path in shard_files(directory):
        tokens = np.fromfile(path, dtype=dtype)
        ends = np.fromfile(path.with_name(path.name + ".index"), dtype="<u8")
        start = 0
        for end in ends.tolist():
            yield tokens[start:end].tolist()
            start = end


def decode_documents(directory: str | Path) -> Iterator[str]:
    """Each document's text, decoded with the dataset's own tokenizer.json (EOS removed)."""
    tokenizer = load_tokenizer(Path(directory) / "tokenizer.json")
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    for ids in iter_shard_documents(directory):
        if ids and ids[-1] == eos_id:
            ids = ids[:-1]
        yield tokenizer.decode(ids, skip_special_tokens=False)
