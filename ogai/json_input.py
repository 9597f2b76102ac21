"""JSON that comes from outside (request bodies, uploaded files), nested no deeper than people
write it.

Python's parser recurses once per level: a body of 5,000 `[` raises RecursionError, which no
caller expects (a 500), and a structure just under the interpreter's limit makes whatever walks
it next recurse too. `loads` refuses both as an invalid document: a `json.JSONDecodeError`, so
callers that already catch bad JSON need nothing more.
"""

import json
from typing import Any

MAX_DEPTH = 64


def loads(text: str | bytes | bytearray, **kwargs: Any) -> Any:
    try:
        value = json.loads(text, **kwargs)
    except RecursionError:
        raise _too_deep(text) from None
    if deeper_than(value):
        raise _too_deep(text)
    return value


class NestedTooDeep(json.JSONDecodeError):
    def __str__(self) -> str:
        # No position: the whole document is at fault, not its first character.
        return self.msg


def _too_deep(text) -> NestedTooDeep:
    # JSONDecodeError counts lines in the document, which it needs as str.
    doc = text if isinstance(text, str) else ""
    return NestedTooDeep(f"nested deeper than {MAX_DEPTH} levels", doc, 0)


def deeper_than(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether parsed JSON (from a parser of its own, such as the gateway's orjson) nests
    deeper than `limit`. A loop, not recursion: the point is not to recurse once per level."""
    stack = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False
