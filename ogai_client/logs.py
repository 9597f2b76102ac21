"""Following a job's logs over an API that answers only "the last N lines".

Each poll asks for the last `window` lines and prints only those after the longest overlap
between the previous answer's end and the new answer's start. A line still being written (no
newline yet) is held back until it is complete or the job ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ogai_client.client import OgaiClient

_SEPARATOR = object()
MIN_WINDOW = 1000
MAX_WINDOW = 10000  # the API's limit


def overlap(previous: list[str], current: list[str]) -> int:
    """The largest k such that the last k lines of `previous` are the first k of `current`
    (a prefix function over current + separator + previous: linear time)."""
    if not previous or not current:
        return 0
    sequence: list[object] = [*current, _SEPARATOR, *previous[-len(current):]]
    prefix = [0] * len(sequence)
    for i in range(1, len(sequence)):
        k = prefix[i - 1]
        while k and sequence[i] != sequence[k]:
            k = prefix[k - 1]
        if sequence[i] == sequence[k]:
            k += 1
        prefix[i] = k
    return prefix[-1]


@dataclass
class Chunk:
    """What one poll brought: new complete lines, whether a new attempt began, and whether
    lines were lost between polls (more than the window arrived at once)."""

    attempt: int | None
    lines: list[str] = field(default_factory=list)
    new_attempt: bool = False
    gap: bool = False


class LogFollower:
    """Polls one replica of a job's newest attempt (or of `attempt`) and yields only new lines.

        follower = LogFollower(client, job_id)
        while not client.job(job_id).is_final:
            print(*follower.poll().lines, sep="\\n")
        print(*follower.poll().lines, *follower.flush(), sep="\\n")
    """

    def __init__(self, client: OgaiClient, job_id: int, *, attempt: int | None = None,
                 replica: int | None = None, tail: int | None = None) -> None:
        self.client = client
        self.job_id = job_id
        self.attempt = attempt
        self.replica = replica
        self.tail = tail
        self.window = min(max(tail or 0, MIN_WINDOW), MAX_WINDOW)
        self.current_attempt: int | None = None
        self._previous: list[str] = []
        self._partial = ""
        self._first = True

    def poll(self) -> Chunk:
        logs = self.client.job_logs(self.job_id, tail=self.window, attempt=self.attempt,
                                    replica=self.replica)
        if logs.attempt is None:
            return Chunk(attempt=None)
        new_attempt = logs.attempt != self.current_attempt
        if new_attempt:
            self.current_attempt = logs.attempt
            self._previous = []
            self._partial = ""
        *complete, partial = logs.text.split("\n")
        k = overlap(self._previous, complete)
        lines = complete[k:]
        gap = bool(self._previous) and k == 0 and len(complete) >= self.window
        if self._first and self.tail is not None:
            lines = lines[-self.tail:] if self.tail else []
        self._first = False
        self._previous = complete
        self._partial = partial
        return Chunk(attempt=logs.attempt, lines=lines, new_attempt=new_attempt, gap=gap)

    def flush(self) -> list[str]:
        """The unfinished last line, once the job has ended."""
        partial, self._partial = self._partial, ""
        return [partial] if partial else []
