"""`ogai logs`: search the output of every job you can see (platform admins: also the platform's
own lines) and read the lines around one.

`ogai logs search WORDS` prints the matching lines oldest first, so the newest is at the bottom
where a terminal leaves the eye, one a line as grep does: when, where (job/attempt/replica:line,
or the platform's source and request id) and the line, the words searched for highlighted.
`--follow` then prints new matching lines below as they arrive, until Ctrl-C. `ogai logs around
JOB --line N` prints the lines before and after line N of a job's log, that one marked `>`.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime
from typing import Any

from rich.text import Text

from ogai_client.cli import Context, about_job, job_id, positive_int, print_json, when
from ogai_client.client import OgaiClient, OgaiError
from ogai_client.models import LogLine

LEVELS = ("debug", "info", "warning", "error", "critical")
SOURCES = ("job", "web", "worker", "beat")
MAX_LIMIT = 1000  # the API's
MAX_CONTEXT = 1000  # the API's
FOLLOW_INTERVAL_S = 2.0
RELATIVE = re.compile(r"^\d{1,6}[smhdw]$")
MATCH_STYLE = "bold red"
WHERE_STYLES = {"warning": "yellow", "error": "red", "critical": "bold red"}
# Control characters shown one for one (a highlight's span still falls on its words): a job's
# colours or carriage returns must not drive the terminal.
_CONTROLS = {code: "\ufffd" for code in (*range(32), 127) if chr(code) != "\t"} | \
    {ord("\r"): " ", ord("\n"): " "}


# -- arguments ----------------------------------------------------------------------------------

def _moment(text: str) -> str:
    """`7d`, `24h`, `30m`, `90s`, `2w` (that long ago) or ISO 8601, local time unless it names
    a zone (as the times printed are)."""
    value = text.strip()
    if RELATIVE.match(value):
        return value
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time: give 7d, 24h, 30m, 90s or 2w (that long ago), or ISO "
            "8601 (2026-12-01T08:00:00)") from None
    return (moment if moment.tzinfo else moment.astimezone()).isoformat()


def _from_one(what: str, most: int | None = None) -> Callable[[str], int]:
    """An argparse type for a whole number from 1 (to `most`)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} {text!r} is not a whole number") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{what} {text!r} is less than 1")
        if most is not None and value > most:
            raise argparse.ArgumentTypeError(f"{what} {text!r} is more than {most}")
        return value

    return parse


def _context(text: str) -> int:
    value = positive_int(text)
    if value > MAX_CONTEXT:
        raise argparse.ArgumentTypeError(f"give at most {MAX_CONTEXT} lines of context")
    return value


def _about(job: int | None) -> AbstractContextManager[None]:
    """A job the caller cannot see is "job N not found (or not visible to you)"."""
    return about_job(job) if job is not None else nullcontext()


# -- formatting ---------------------------------------------------------------------------------

def _where(line: LogLine) -> str:
    if line.is_job_output:
        return f"job {line.job}/attempt {line.attempt}/replica {line.replica}:{line.line}"
    return " ".join(part for part in (line.source or "platform", line.request_id) if part)


def _message(line: LogLine, style: str = "") -> Text:
    text = Text(line.message.translate(_CONTROLS), style=style)
    for start, end in line.highlights:
        if 0 <= start < end <= len(line.message):
            text.stylize(MATCH_STYLE, start, end)
    return text


def hit(line: LogLine) -> Text:
    """One found line: `TIME job J/attempt A/replica R:LINE  message`, or `TIME source
    request_id  message` for the platform's own."""
    return Text.assemble((when(line.ts), "dim"), " ",
                         (_where(line), WHERE_STYLES.get(line.level, "cyan")), "  ",
                         _message(line))


def _show(ctx: Context, lines: Iterable[LogLine], as_json: bool) -> None:
    for line in lines:
        if as_json:
            ctx.out.file.write(json.dumps(line.raw) + "\n")
            ctx.out.file.flush()
        else:
            ctx.out.print(hit(line), soft_wrap=True)


# -- commands -----------------------------------------------------------------------------------

def cmd_logs_search(args: argparse.Namespace, ctx: Context) -> int:
    if args.job is None and (args.attempt is not None or args.replica is not None):
        raise OgaiError("usage", "--attempt and --replica need --job: name the job whose "
                        "attempt or replica to search")
    if args.follow and args.until:
        raise OgaiError("usage", "--follow prints new lines as they arrive: leave out --until")
    client = ctx.client()
    words = " ".join(args.words)
    filters: dict[str, Any] = {"job": args.job, "attempt": args.attempt,
                               "replica": args.replica, "level": args.level,
                               "source": args.source, "request_id": args.request_id,
                               "since": args.since}
    with _about(args.job):
        found = client.log_search(words, until=args.until, limit=args.limit, **filters)
    if args.json and not args.follow:
        print_json(ctx, found.raw)
        return 0
    # The API answers newest first; printed oldest first, the newest ends at the bottom.
    _show(ctx, reversed(found.results), args.json)
    if found.more:
        ctx.note(f"the newest {len(found.results)} matching lines; older ones are left out: "
                 f"narrow with --since/--until or raise --limit (at most {MAX_LIMIT})")
    elif not found.results and not args.follow:
        ctx.note("no lines match")
    if not args.follow:
        return 0
    # With nothing found yet the tail starts at the first line: every line there is now failed
    # the search, so only new ones can come.
    newest = max((line.id for line in found.results), default=0)
    return _follow(ctx, client, words, filters, after=newest, limit=args.limit,
                   as_json=args.json)


def _pause(seconds: float) -> None:
    """Between two polls of `--follow` (tests replace it to ship lines meanwhile)."""
    time.sleep(seconds)


def _follow(ctx: Context, client: OgaiClient, words: str, filters: dict[str, Any], *,
            after: int, limit: int, as_json: bool) -> int:
    """Print the matching lines after line `after` every FOLLOW_INTERVAL_S, until Ctrl-C."""
    ctx.note(f"following: new lines every {FOLLOW_INTERVAL_S:g} s; Ctrl-C stops")
    try:
        while True:
            _pause(FOLLOW_INTERVAL_S)
            while True:  # more than `limit` lines arrived: page on at once
                found = client.log_search(words, after=after, limit=limit, **filters)
                _show(ctx, found.results, as_json)
                after = max([after, *(line.id for line in found.results)])
                if not found.more or not found.results:
                    break
    except KeyboardInterrupt:
        return 0  # the way a live tail ends, not a failure


def cmd_logs_around(args: argparse.Namespace, ctx: Context) -> int:
    client = ctx.client()
    with about_job(args.job):
        found = client.log_around(args.job, line=args.line, attempt=args.attempt,
                                  replica=args.replica, context=args.context, q=args.q or "")
    if args.json:
        print_json(ctx, found.raw)
        return 0
    if found.attempt is None:
        ctx.note(f"job {found.job} has not started yet: no logs")
        return 0
    where = f"job {found.job}/attempt {found.attempt}/replica {found.replica}"
    numbers = [line.line for line in found.lines if line.line is not None]
    if found.line not in numbers:
        last = max(numbers, default=0)
        raise OgaiError("not_found", f"{where} has no line {found.line}" +
                        (f" (its last is line {last})" if 0 < last < found.line else ""))
    ctx.note(f"{where}: lines {min(numbers)}-{max(numbers)}, line {found.line} marked >")
    width = len(str(max(numbers)))
    for line in found.lines:
        asked = line.line == found.line
        ctx.out.print(Text.assemble(
            (">" if asked else " ", "bold"), " ",
            (str(line.line if line.line is not None else "").rjust(width),
             "bold" if asked else "dim"),
            "  ", _message(line, "bold" if asked else "")), soft_wrap=True)
    return 0


# -- the parser ---------------------------------------------------------------------------------

def add_commands(commands: Any, command: Callable[..., Any]) -> None:
    """Add `logs` (`search`, `around`) to the CLI's parser."""
    logs = commands.add_parser(
        "logs", help="search jobs' output, and read the lines around one",
        description="Search the output of every job you can see (platform admins: also the "
        "platform's own lines), and read the lines around one.")
    logs.set_defaults(handler=None, group=logs)
    actions = logs.add_subparsers(dest="logs_command", metavar="ACTION")

    search = command(actions, "search", cmd_logs_search,
                     "print the lines with every word searched for, oldest first so the newest "
                     "is at the bottom (as grep prints), one a line: TIME job J/attempt "
                     "A/replica R:LINE  message (platform lines: TIME source request-id  "
                     "message)")
    search.add_argument("words", nargs="*", metavar="WORDS",
                        help='words and "quoted phrases" a line must all have (none: every '
                        "line the options let through)")
    search.add_argument("--since", type=_moment, metavar="WHEN",
                        help="lines since then: 7d, 24h, 30m, 90s or 2w ago, or ISO 8601 "
                        "(local time unless it names a zone)")
    search.add_argument("--until", type=_moment, metavar="WHEN",
                        help="lines before then, given as --since is")
    search.add_argument("--job", type=job_id, metavar="ID", help="only this job's output")
    search.add_argument("--attempt", type=_from_one("attempt"), metavar="N",
                        help="only this attempt of --job")
    search.add_argument("--replica", type=positive_int, metavar="N",
                        help="only this replica of --job")
    search.add_argument("--level", choices=LEVELS, help="only lines of this level")
    search.add_argument("--source", choices=SOURCES,
                        help="job: jobs' output; web, worker, beat: the platform's own lines "
                        "(platform admins)")
    search.add_argument("--request-id", metavar="ID",
                        help="only the platform's lines of this request")
    search.add_argument("--limit", "-n", type=_from_one("limit", MAX_LIMIT), default=100,
                        metavar="N", help=f"at most this many lines, the newest (default "
                        f"100, at most {MAX_LIMIT})")
    search.add_argument("--follow", "-f", action="store_true",
                        help=f"then print new matching lines as they arrive (every "
                        f"{FOLLOW_INTERVAL_S:g} s) until Ctrl-C")
    search.add_argument("--json", action="store_true",
                        help="print the API's JSON (newest first); with --follow, one JSON "
                        "object a line, oldest first")

    around = command(actions, "around", cmd_logs_around,
                     "print the lines before and after one line of a job's log, with their "
                     "numbers, the asked one marked >")
    around.add_argument("job", type=job_id, metavar="JOB", help="the job's id")
    around.add_argument("--line", "-l", type=_from_one("line number"), required=True,
                        metavar="N", help="the line (as `ogai logs search` prints it)")
    around.add_argument("--attempt", type=_from_one("attempt"), metavar="N",
                        help="this attempt (default: the newest)")
    around.add_argument("--replica", type=positive_int, default=0, metavar="N",
                        help="this replica (default 0)")
    around.add_argument("--context", "-C", type=_context, default=100, metavar="N",
                        help=f"lines before and after it (default 100, at most {MAX_CONTEXT})")
    around.add_argument("--q", "--highlight", dest="q", metavar="WORDS",
                        help="highlight these words")
    around.add_argument("--json", action="store_true", help="print the API's JSON")
