"""Rating: usage records, reservations and a plan's prices in, invoice lines out.

A pure function of its inputs (no ORM, no clock, no settings), so rating the same month twice
gives the same lines, and tests can check it by hand. The rules:

- The month is the calendar month in the billing time zone: [first midnight, next month's first
  midnight), both as aware datetimes. A job or lease spanning a month boundary is billed for the
  part inside the month, exactly, from its timestamps; tokens are billed in the month of
  `ended_at`.
- Quantities come from integer microseconds (or token counts) as `Decimal`, quantised to 6
  places with ROUND_HALF_UP: GPU-hours = GPUs x µs / 3.6e9, server-hours = µs / 3.6e9, million
  tokens = (prompt + completion) / 1e6. Each line's amount = quantity x unit price, rounded to
  cents (ROUND_HALF_UP); the total is the sum of the lines' amounts. No float anywhere.
- A rate applies to a usage key (GPU model, or model name for tokens) when its `match` equals the
  key, else the plan's rate with an empty match does. Usage no rate applies to still gets a line,
  at price 0, that says "no rate in plan X": nothing disappears silently.
- Reserved capacity: each reservation overlapping the month is a RESERVED_GPU_MONTH line of
  GPUs x (days covered / days in the month). GPU-hours of that GPU model used inside the
  reservations' days, up to GPUs x hours covered, are then covered by it (a line at price 0 with
  the covered quantity); only the rest is billed by the GPU-hour.
- Lines are grouped per (resource, match) and ordered deterministically: reservations, GPU-hours,
  server-hours, tokens; within a resource by match, the catch-all rate last.
"""

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import ROUND_HALF_UP, Context, Decimal, localcontext
from typing import Protocol
from zoneinfo import ZoneInfo

from infra_os.choices import RatedResource

JOB = "job"
LEASE = "lease"
TOKENS = "tokens"

MICROSECONDS_PER_HOUR = 3_600_000_000
TOKENS_PER_MILLION = 1_000_000
QUANTITY_STEP = Decimal("0.000001")
CENT = Decimal("0.01")
ZERO = Decimal(0)
# Wide enough that no product of a quantity and a price is ever rounded before we round it.
EXACT = Context(prec=60)

UNITS = {
    RatedResource.GPU_HOUR: "GPU-hour",
    RatedResource.SERVER_HOUR: "server-hour",
    RatedResource.MILLION_TOKENS: "million tokens",
    RatedResource.RESERVED_GPU_MONTH: "GPU-month",
}
RESOURCE_ORDER = {
    RatedResource.RESERVED_GPU_MONTH: 0,
    RatedResource.GPU_HOUR: 1,
    RatedResource.SERVER_HOUR: 2,
    RatedResource.MILLION_TOKENS: 3,
}
MATCH_LENGTH = 64
DESCRIPTION_LENGTH = 200


class UsageLike(Protocol):
    """What rating reads of a usage record (a `UsageRecord` fits)."""

    @property
    def kind(self) -> str: ...
    @property
    def gpus(self) -> int: ...
    @property
    def gpu_model(self) -> str: ...
    @property
    def started_at(self) -> datetime: ...
    @property
    def ended_at(self) -> datetime: ...
    @property
    def model_name(self) -> str: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...


class ReservationLike(Protocol):
    """What rating reads of a reservation (a `Reservation` fits)."""

    @property
    def gpu_model(self) -> str: ...
    @property
    def gpus(self) -> int: ...
    @property
    def starts_on(self) -> date: ...
    @property
    def ends_on(self) -> date | None: ...


@dataclass(frozen=True)
class PlanPrices:
    """A plan's name, currency and prices: {(resource, match): unit price}."""

    name: str
    currency: str
    rates: Mapping[tuple[str, str], Decimal] = field(default_factory=dict)


@dataclass(frozen=True)
class BillingPeriod:
    """One calendar month in a time zone: [start, end), aware datetimes in UTC."""

    month: date
    time_zone: str
    start: datetime
    end: datetime

    @property
    def last_day(self) -> date:
        return next_month(self.month) - timedelta(days=1)

    @property
    def days(self) -> int:
        return (next_month(self.month) - self.month).days

    def midnight(self, day: date) -> datetime:
        return local_midnight(day, self.time_zone)


@dataclass(frozen=True)
class LineDraft:
    resource: str
    match: str
    description: str
    quantity: Decimal
    unit: str
    unit_price: Decimal
    amount: Decimal


def next_month(month: date) -> date:
    return date(month.year + month.month // 12, month.month % 12 + 1, 1)


def local_midnight(day: date, time_zone: str) -> datetime:
    """The instant the day begins in the time zone, in UTC."""
    return datetime.combine(day, time.min, tzinfo=ZoneInfo(time_zone)).astimezone(UTC)


def month_period(month: date, time_zone: str) -> BillingPeriod:
    first = month.replace(day=1)
    return BillingPeriod(month=first, time_zone=time_zone,
                         start=local_midnight(first, time_zone),
                         end=local_midnight(next_month(first), time_zone))


def microseconds(delta: timedelta) -> int:
    return delta // timedelta(microseconds=1)


def overlap_us(start: datetime, end: datetime, window_start: datetime,
               window_end: datetime) -> int:
    """Microseconds of [start, end) inside [window_start, window_end). Aware datetimes are
    compared in UTC: subtracting two of the same zone would ignore a DST change between them."""
    low = max(start.astimezone(UTC), window_start.astimezone(UTC))
    high = min(end.astimezone(UTC), window_end.astimezone(UTC))
    return max(0, microseconds(high - low))


def hours(us: int) -> Decimal:
    return quantised(Decimal(us) / MICROSECONDS_PER_HOUR)


def quantised(value: Decimal) -> Decimal:
    with localcontext(EXACT):
        return value.quantize(QUANTITY_STEP, rounding=ROUND_HALF_UP)


def amount_of(quantity: Decimal, unit_price: Decimal) -> Decimal:
    with localcontext(EXACT):
        return (quantity * unit_price).quantize(CENT, rounding=ROUND_HALF_UP)


def invoice_total(lines: Iterable[LineDraft]) -> Decimal:
    with localcontext(EXACT):
        return sum((line.amount for line in lines), Decimal("0.00")).quantize(CENT)


def _clip(text: str, length: int) -> str:
    return text if len(text) <= length else text[:length - 3] + "..."


def _key_label(key: str) -> str:
    return key or "unspecified"


def _keys_label(keys: Iterable[str]) -> str:
    return ", ".join(_key_label(key) for key in sorted(keys))


def _rate_for(plan: PlanPrices, resource: str, key: str) -> tuple[str, Decimal] | None:
    """The (match, price) that applies to `key`: its own rate, else the catch-all, else None."""
    if (resource, key) in plan.rates:
        return key, plan.rates[(resource, key)]
    if (resource, "") in plan.rates:
        return "", plan.rates[(resource, "")]
    return None


@dataclass
class _Sorted:
    sort_key: tuple
    line: LineDraft


def _line(resource: str, match: str, description: str, quantity: Decimal,
          unit_price: Decimal) -> LineDraft:
    return LineDraft(
        resource=str(resource), match=_clip(match, MATCH_LENGTH),
        description=_clip(description, DESCRIPTION_LENGTH), quantity=quantity,
        unit=UNITS[RatedResource(resource)], unit_price=unit_price,
        amount=amount_of(quantity, unit_price),
    )


def _match_order(resource: str, match: str, sub: int, *extra) -> tuple:
    # The catch-all (empty match) after the named ones.
    return (RESOURCE_ORDER[RatedResource(resource)], match == "", match, sub, *extra)


class _Grouped:
    """Usage of one resource by key, priced into lines per (resource, match)."""

    NOUNS = {
        RatedResource.GPU_HOUR: ("GPU-hours", "GPU model"),
        RatedResource.SERVER_HOUR: ("Server-hours (leases)", "GPU model"),
        RatedResource.MILLION_TOKENS: ("Million tokens", "model"),
    }

    def __init__(self, resource: str, plan: PlanPrices):
        self.resource = resource
        self.plan = plan
        self.priced: dict[str, int] = defaultdict(int)
        self.priced_keys: dict[str, set[str]] = defaultdict(set)
        self.unpriced: dict[str, int] = defaultdict(int)

    def add(self, key: str, amount: int) -> None:
        rate = _rate_for(self.plan, self.resource, key)
        if rate is None:
            self.unpriced[key] += amount
        else:
            self.priced[rate[0]] += amount
            self.priced_keys[rate[0]].add(key)

    def lines(self, to_quantity: Callable[[int], Decimal]) -> list[_Sorted]:
        noun, key_noun = self.NOUNS[RatedResource(self.resource)]
        result = []
        for match, amount in self.priced.items():
            price = self.plan.rates[(self.resource, match)]
            if match:
                description = f"{noun}, {match}"
            else:
                keys = _keys_label(self.priced_keys[match])
                description = f"{noun}, any other {key_noun}: {keys}"
            result.append(_Sorted(_match_order(self.resource, match, 1),
                                  _line(self.resource, match, description, to_quantity(amount),
                                        price)))
        for key, amount in self.unpriced.items():
            description = f"{noun}, {_key_label(key)} - no rate in plan {self.plan.name}"
            result.append(_Sorted(_match_order(self.resource, key, 2),
                                  _line(self.resource, key, description, to_quantity(amount),
                                        ZERO)))
        return result


def _union(intervals: list[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    merged: list[tuple[datetime, datetime]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def rate_month(records: Iterable[UsageLike], reservations: Iterable[ReservationLike],
               plan: PlanPrices | None, period: BillingPeriod) -> list[LineDraft]:
    """The invoice lines of one tenant's month. No plan: no lines (the invoice says why)."""
    if plan is None:
        return []
    records = list(records)
    sorted_lines: list[_Sorted] = []

    # Reservations: one line each, and the windows whose GPU-hours they cover.
    windows: dict[str, list[tuple[datetime, datetime]]] = defaultdict(list)
    pool_us: dict[str, int] = defaultdict(int)
    for reservation in reservations:
        first = max(reservation.starts_on, period.month)
        last = min(reservation.ends_on or period.last_day, period.last_day)
        if first > last:
            continue
        days = (last - first).days + 1
        window = (period.midnight(first), period.midnight(last + timedelta(days=1)))
        windows[reservation.gpu_model].append(window)
        pool_us[reservation.gpu_model] += reservation.gpus * microseconds(window[1] - window[0])
        with localcontext(EXACT):
            quantity = quantised(Decimal(reservation.gpus * days) / period.days)
        rate = _rate_for(plan, RatedResource.RESERVED_GPU_MONTH, reservation.gpu_model)
        description = (f"Reserved {reservation.gpus} x {reservation.gpu_model}, {first} to {last}"
                       f" ({days}/{period.days} days)")
        if rate is None:
            description += f" - no rate in plan {plan.name}"
        sorted_lines.append(_Sorted(
            _match_order(RatedResource.RESERVED_GPU_MONTH, reservation.gpu_model, 0, first,
                         last, reservation.gpus),
            _line(RatedResource.RESERVED_GPU_MONTH, reservation.gpu_model, description,
                  quantity, rate[1] if rate else ZERO),
        ))

    gpu_us: dict[str, int] = defaultdict(int)
    reserved_window_us: dict[str, int] = defaultdict(int)
    servers = _Grouped(RatedResource.SERVER_HOUR, plan)
    tokens = _Grouped(RatedResource.MILLION_TOKENS, plan)
    merged = {model: _union(spans) for model, spans in windows.items()}
    for record in records:
        if record.kind == JOB and record.gpus > 0:
            used = overlap_us(record.started_at, record.ended_at, period.start, period.end)
            gpu_us[record.gpu_model] += record.gpus * used
            for window in merged.get(record.gpu_model, ()):
                reserved_window_us[record.gpu_model] += record.gpus * overlap_us(
                    record.started_at, record.ended_at, *window)
        elif record.kind == LEASE:
            used = overlap_us(record.started_at, record.ended_at, period.start, period.end)
            if used:
                servers.add(record.gpu_model, used)
        elif record.kind == TOKENS and period.start <= record.ended_at < period.end:
            count = record.prompt_tokens + record.completion_tokens
            if count:
                tokens.add(record.model_name, count)

    gpu_hours = _Grouped(RatedResource.GPU_HOUR, plan)
    for model, used in gpu_us.items():
        if not used:
            continue
        covered = min(reserved_window_us[model], pool_us[model])
        if covered:
            sorted_lines.append(_Sorted(
                _match_order(RatedResource.GPU_HOUR, model, 0),
                _line(RatedResource.GPU_HOUR, model,
                      f"GPU-hours, {_key_label(model)} - covered by reservation",
                      hours(covered), ZERO),
            ))
        if used > covered:
            gpu_hours.add(model, used - covered)

    sorted_lines += gpu_hours.lines(hours)
    sorted_lines += servers.lines(hours)
    sorted_lines += tokens.lines(lambda count: quantised(Decimal(count) / TOKENS_PER_MILLION))
    sorted_lines.sort(key=lambda item: item.sort_key)
    return [item.line for item in sorted_lines]
