"""Sign-in throttling, tried as an attacker: a spoofed X-Forwarded-For does not reset the
count, guessing one username from many addresses is throttled, the console's and the admin's
sign-in refuse like the API's, and the counts live in the cache the web processes share."""

import re
import uuid

import pytest
import redis
from django.core.cache.backends.redis import RedisCache
from django.test import RequestFactory, override_settings

from ogai.sign_in import SignInThrottled, throttled_authenticate, username_key

API_LOGIN = "/api/v1/infra-os/auth/login/"
CONSOLE_LOGIN = "/login/"
ADMIN_LOGIN = "/admin/login/"
REFUSAL = re.compile(r"Too many sign-in attempts; try again in (\d+) s\.")


def _api(client, username, password, **meta):
    return client.post(API_LOGIN, {"username": username, "password": password},
                       content_type="application/json", **meta)


def _form(client, url, username, password, **meta):
    return client.post(url, {"username": username, "password": password}, **meta)


def _refused(response):
    assert response.status_code == 429, response.content
    assert int(response["Retry-After"]) >= 1
    match = REFUSAL.search(response.content.decode())
    assert match, response.content
    assert int(match.group(1)) == int(response["Retry-After"])
    return response


@pytest.fixture
def per_address(settings):
    """Five attempts per address; the per-username count out of the way."""
    settings.OGAI_LOGIN_RATE = "5/minute"
    settings.OGAI_LOGIN_FAILURE_RATE = ""


def test_rotating_a_spoofed_forwarded_for_does_not_reset_the_count(client, world, password,
                                                                    per_address, settings):
    for number in range(5):
        response = _api(client, f"guess{number}", "wrong", REMOTE_ADDR="203.0.113.9",
                        HTTP_X_FORWARDED_FOR=f"198.51.100.{number}")
        assert response.status_code == 401
    _refused(_api(client, "guess5", "wrong", REMOTE_ADDR="203.0.113.9",
                  HTTP_X_FORWARDED_FOR="198.51.100.99"))
    # Even the right password: the refusal comes before any password is checked.
    _refused(_api(client, "alpha-member", password, REMOTE_ADDR="203.0.113.9"))
    assert _api(client, "alpha-member", password, REMOTE_ADDR="203.0.113.10").status_code == 200


def test_with_a_trusted_proxy_only_the_proxys_own_entry_is_believed(client, world, password,
                                                                     per_address, settings):
    settings.OGAI_USE_X_FORWARDED_FOR = True
    settings.OGAI_TRUSTED_PROXIES = ["10.0.0.1/32"]
    # Straight to the platform, not through the proxy: the header is the attacker's own.
    for number in range(5):
        assert _api(client, f"guess{number}", "wrong", REMOTE_ADDR="203.0.113.9",
                    HTTP_X_FORWARDED_FOR=f"198.51.100.{number}").status_code == 401
    _refused(_api(client, "guess5", "wrong", REMOTE_ADDR="203.0.113.9",
                  HTTP_X_FORWARDED_FOR="10.0.0.1"))
    # Through the proxy, a spoofed left part is ignored: the proxy's appended entry counts.
    for number in range(5):
        assert _api(client, f"guess{number}", "wrong", REMOTE_ADDR="10.0.0.1",
                    HTTP_X_FORWARDED_FOR=f"192.0.2.{number}, 198.51.100.7").status_code == 401
    _refused(_api(client, "guess5", "wrong", REMOTE_ADDR="10.0.0.1",
                  HTTP_X_FORWARDED_FOR="192.0.2.200, 198.51.100.7"))
    # Another client behind the same proxy is counted on its own.
    assert _api(client, "alpha-member", password, REMOTE_ADDR="10.0.0.1",
                HTTP_X_FORWARDED_FOR="198.51.100.8").status_code == 200


def test_guessing_one_username_from_many_addresses_is_throttled(client, world, password,
                                                                settings):
    settings.OGAI_LOGIN_FAILURE_RATE = "3/15min"
    for name in ("alpha-member", "no-such-account"):
        for number in range(3):
            assert _api(client, name, "wrong",
                        REMOTE_ADDR=f"203.0.113.{number}").status_code == 401
        # A name that is no account is throttled the same: the refusal tells no names apart.
        _refused(_api(client, name, "wrong", REMOTE_ADDR="198.51.100.1"))
    _refused(_api(client, "alpha-member", password, REMOTE_ADDR="198.51.100.2"))
    # Other accounts are not held up.
    assert _api(client, "alpha-admin", password, REMOTE_ADDR="203.0.113.0").status_code == 200


def test_the_owners_sign_in_gives_the_guesser_no_fresh_allowance(client, world, password,
                                                                 settings):
    settings.OGAI_LOGIN_FAILURE_RATE = "3/15min"
    for number in range(2):
        assert _api(client, "alpha-member", f"guess{number}",
                    REMOTE_ADDR=f"203.0.113.{number}").status_code == 401
    assert _api(client, "alpha-member", password, REMOTE_ADDR="192.0.2.10").status_code == 200
    # The owner's success took back only its own count: one guess is left, not three.
    assert _api(client, "alpha-member", "guess2", REMOTE_ADDR="203.0.113.5").status_code == 401
    _refused(_api(client, "alpha-member", "guess3", REMOTE_ADDR="203.0.113.6"))


def test_a_legitimate_user_under_the_limits_is_not_refused(client, world, password, settings):
    settings.OGAI_LOGIN_RATE = "6/minute"
    settings.OGAI_LOGIN_FAILURE_RATE = "3/15min"
    for _ in range(2):
        assert _api(client, "alpha-member", "typo").status_code == 401
    for _ in range(4):
        assert _api(client, "alpha-member", password).status_code == 200
    assert _form(client, CONSOLE_LOGIN, "alpha-member", password,
                 REMOTE_ADDR="192.0.2.20").status_code == 302


def test_the_console_sign_in_refuses_after_the_limit(client, world, password):
    # The defaults: 10 failures per username, 20 attempts per address.
    statuses = [_form(client, CONSOLE_LOGIN, "alpha-member", f"wrong{number}").status_code
                for number in range(30)]
    assert statuses == [200] * 10 + [429] * 20
    refused = _refused(_form(client, CONSOLE_LOGIN, "alpha-member", password,
                             REMOTE_ADDR="192.0.2.30"))
    assert b'role="alert"' in refused.content  # shown on the form, as the form's error
    assert client.get("/").status_code == 302  # not signed in
    # Every username, from one address: refused once the address has made 20 attempts.
    statuses = [_form(client, CONSOLE_LOGIN, f"user{number}", "wrong",
                      REMOTE_ADDR="192.0.2.31").status_code for number in range(21)]
    assert statuses == [200] * 20 + [429]


def test_the_admin_sign_in_refuses_after_the_limit(client, world, password, settings):
    settings.OGAI_LOGIN_FAILURE_RATE = "3/15min"
    for number in range(3):
        response = _form(client, ADMIN_LOGIN, "operator", f"wrong{number}")
        assert response.status_code == 200
        assert b"correct username and password" in response.content
    _refused(_form(client, ADMIN_LOGIN, "operator", password))
    assert client.get("/admin/").status_code == 302  # not signed in


def test_the_three_doors_share_one_count(client, world, password, settings):
    settings.OGAI_LOGIN_FAILURE_RATE = "3/15min"
    assert _api(client, "operator", "wrong").status_code == 401
    assert _form(client, CONSOLE_LOGIN, "operator", "wrong").status_code == 200
    assert _form(client, ADMIN_LOGIN, "operator", "wrong").status_code == 200
    _refused(_api(client, "operator", password))
    _refused(_form(client, CONSOLE_LOGIN, "operator", password))
    _refused(_form(client, ADMIN_LOGIN, "operator", password))


def test_web_processes_share_the_count_through_redis(client, world, password, settings):
    """Two cache clients of one Redis, as two web processes have: failures counted through one
    refuse sign-ins through the other."""
    url = "redis://127.0.0.1:6379/14"
    prefix = f"ogai-test-{uuid.uuid4().hex}"
    settings.OGAI_LOGIN_FAILURE_RATE = "3/15min"
    server = redis.Redis.from_url(url)
    other_process = RedisCache(url, {"KEY_PREFIX": prefix})
    try:
        with override_settings(CACHES={"default": {
                "BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": url,
                "KEY_PREFIX": prefix}}):
            request = RequestFactory().post(API_LOGIN, REMOTE_ADDR="203.0.113.50")
            for number in range(3):
                assert throttled_authenticate(request, username="alpha-member",
                                              password=f"wrong{number}",
                                              cache=other_process) is None
            with pytest.raises(SignInThrottled):
                throttled_authenticate(request, username="alpha-member", password=password,
                                       cache=other_process)
            # This process's own cache client, another connection, sees the same counts.
            _refused(_api(client, "alpha-member", password, REMOTE_ADDR="198.51.100.60"))
        stored = [key.decode() for key in server.scan_iter(f"{prefix}:*")]
        assert any(username_key("alpha-member") in key for key in stored), stored
    finally:
        for key in server.scan_iter(f"{prefix}:*"):
            server.delete(key)
