"""Sign-in throttling: one rule for every door, the API's `auth/login/`, the console's `/login/`
and the admin's `/admin/login/`, counted together.

Two counters, both in Django's cache (a Redis shared by every web process when OGAI_CACHE_URL
is set, so the processes agree):
- per client address (`client_ip`: X-Forwarded-For only from trusted proxies), every attempt,
  at most OGAI_LOGIN_RATE;
- per username, whatever address the attempts come from, the failed ones, at most
  OGAI_LOGIN_FAILURE_RATE. Names that are no account count the same as accounts, so a refusal
  says nothing about which names exist.

A window opens with its first counted attempt and lasts the rate's period. While either counter
is spent, an attempt is refused before the password is checked, so a refusal says nothing about
the password, the right one included. A successful sign-in clears neither counter: it only takes
back its own provisional count. Failures someone made guessing from elsewhere stay until their
window ends, so the owner signing in meanwhile never hands the guesser a fresh allowance (the
price: while a username's window is spent, its owner waits too).
"""

import hashlib
import re
import time
from dataclasses import dataclass
from functools import lru_cache, wraps

from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import authenticate
from django.contrib.auth.forms import AuthenticationForm
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured, ValidationError

from ogai.request_context import client_ip

_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*(s|m|h|d)[a-z]*\s*$", re.IGNORECASE)
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# Where a throttled form leaves the wait, for `refused_with_429` to answer with.
_WAIT_ATTRIBUTE = "_ogai_sign_in_wait_s"


@dataclass(frozen=True)
class Rate:
    limit: int
    period_s: int


@lru_cache(maxsize=16)
def parse_rate(text: str) -> Rate | None:
    """"20/minute", "10/15min", "5/30s" → Rate; empty → None (no limit)."""
    if not text.strip():
        return None
    match = _RATE.match(text)
    if not match:
        raise ImproperlyConfigured(
            f"{text!r} is not a rate: write N/period, e.g. 20/minute or 10/15min.")
    count, multiple, unit = match.groups()
    return Rate(int(count), int(multiple or 1) * _UNIT_S[unit.lower()])


class SignInThrottled(Exception):
    def __init__(self, wait_s: int):
        self.wait_s = wait_s
        super().__init__(self.message)

    @property
    def message(self) -> str:
        return f"Too many sign-in attempts; try again in {self.wait_s} s."


class _Window:
    """A counter of one key in the cache for one rate, its window opened by its first hit."""

    def __init__(self, cache, name: str, rate: Rate):
        self.cache, self.rate = cache, rate
        now = time.time()
        # add() is atomic (SET NX in Redis): concurrent first hits agree on one window.
        self.cache.add(f"{name}:start", int(now), timeout=rate.period_s)
        start = self.cache.get(f"{name}:start") or int(now)
        self.remaining_s = max(1, int(start + rate.period_s - now + 0.999))
        self.key = f"{name}:{start}"

    def count(self) -> int:
        return self.cache.get(self.key, 0)

    def hit(self, delta: int = 1) -> int:
        self.cache.add(self.key, 0, timeout=self.remaining_s + 1)
        try:
            return self.cache.incr(self.key, delta)
        except ValueError:  # expired between add and incr
            self.cache.set(self.key, max(delta, 0), timeout=self.remaining_s + 1)
            return delta

    def spent(self, count: int) -> bool:
        return count > self.rate.limit


def address_key(address: str | None) -> str:
    return f"sign-in:address:{address or 'unknown'}"


def username_key(username: str) -> str:
    # Hashed: any text is a valid key; case-folded: "Alice" and "alice" share a budget.
    digest = hashlib.sha256(username.strip().casefold().encode()).hexdigest()
    return f"sign-in:username:{digest}"


def throttled_authenticate(request, *, username: str, password: str, cache=None):
    """`authenticate()` behind the sign-in throttle: the user, or None for a wrong password;
    raises SignInThrottled, before the password is checked, when the client's address or the
    username has spent its attempts."""
    cache = cache or caches["default"]
    address_rate = parse_rate(settings.OGAI_LOGIN_RATE)
    if address_rate is not None:
        window = _Window(cache, address_key(client_ip(request)), address_rate)
        if window.spent(window.hit()):
            raise SignInThrottled(window.remaining_s)
    failure_rate = parse_rate(settings.OGAI_LOGIN_FAILURE_RATE)
    failures = None
    if failure_rate is not None:
        failures = _Window(cache, username_key(username), failure_rate)
        # Counted as a failure before the password is checked, so parallel guesses cannot all
        # slip under the limit; a success takes back only this one count.
        if failures.spent(failures.hit()):
            raise SignInThrottled(failures.remaining_s)
    user = authenticate(request, username=username, password=password)
    if user is not None and failures is not None:
        failures.hit(-1)
    return user


class ThrottledSignInMixin:
    """For AuthenticationForm subclasses: authenticate through the throttle; a refusal is the
    form's error, and `refused_with_429` turns the page into a 429."""

    def clean(self):
        username = self.cleaned_data.get("username")
        password = self.cleaned_data.get("password")
        if username is not None and password:
            try:
                self.user_cache = throttled_authenticate(
                    self.request, username=username, password=password)
            except SignInThrottled as exc:
                if self.request is not None:
                    setattr(self.request, _WAIT_ATTRIBUTE, exc.wait_s)
                raise ValidationError(exc.message, code="throttled") from None
            if self.user_cache is None:
                raise self.get_invalid_login_error()
            self.confirm_login_allowed(self.user_cache)
        return self.cleaned_data


class ThrottledAuthenticationForm(ThrottledSignInMixin, AuthenticationForm):
    """The console's sign-in form."""


class ThrottledAdminAuthenticationForm(ThrottledSignInMixin, AdminAuthenticationForm):
    """The Django admin's sign-in form."""


def refused_with_429(view):
    """Wrap a sign-in view whose form is throttled: a refused attempt answers 429 with
    Retry-After (the page still shows the form and its message)."""

    @wraps(view)
    def wrapped(request, *args, **kwargs):
        response = view(request, *args, **kwargs)
        wait_s = getattr(request, _WAIT_ATTRIBUTE, None)
        if wait_s is not None:
            response.status_code = 429
            response["Retry-After"] = str(wait_s)
        return response

    return wrapped
