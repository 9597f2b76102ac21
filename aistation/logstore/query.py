"""What a search's text means, the same in every backend.

A line is split into words the way both indexes split it: runs of letters and digits,
lowercased; everything else separates. A query is words and "quoted phrases"; a line matches
when it holds every one of them, a phrase as consecutive words. A bare word with punctuation
inside (`torch.OutOfMemoryError`, `ib0:1`) is a phrase of its parts, so it finds what it looks
like it finds.
"""

from __future__ import annotations

import re

WORD = re.compile(r"[^\W_]+")
MAX_PHRASES = 16
MAX_WORDS = 64

Phrase = tuple[str, ...]


class QueryError(ValueError):
    pass


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def parse(text: str) -> tuple[Phrase, ...]:
    """The phrases of a query: `NCCL "out of memory"` → (("nccl",), ("out", "of", "memory"))."""
    if text.count('"') % 2:
        raise QueryError('A quote is not closed: put a " at the end of the phrase.')
    phrases: list[Phrase] = []
    for number, part in enumerate(text.split('"')):
        pieces = [part] if number % 2 else part.split()
        for piece in pieces:
            found = tuple(words(piece))
            if found and found not in phrases:
                phrases.append(found)
    if len(phrases) > MAX_PHRASES or sum(map(len, phrases)) > MAX_WORDS:
        raise QueryError(f"Search for at most {MAX_PHRASES} words or phrases "
                         f"({MAX_WORDS} words in all).")
    return tuple(phrases)


def highlight_spans(line: str, phrases: tuple[Phrase, ...]) -> list[tuple[int, int]]:
    """Where each phrase occurs in `line`, as sorted, merged (start, end) character spans."""
    found = [(m.start(), m.end(), m.group().lower()) for m in WORD.finditer(line)]
    spans: list[tuple[int, int]] = []
    for phrase in phrases:
        size = len(phrase)
        for i in range(len(found) - size + 1):
            if tuple(word for _s, _e, word in found[i:i + size]) == phrase:
                spans.append((found[i][0], found[i + size - 1][1]))
    spans.sort()
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def matches(line: str, phrases: tuple[Phrase, ...]) -> bool:
    tokens = words(line)
    text = f" {' '.join(tokens)} "
    return all(f" {' '.join(phrase)} " in text for phrase in phrases)
