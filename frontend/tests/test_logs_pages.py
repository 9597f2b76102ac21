"""The log search page: members find their jobs' lines (the words marked, the text escaped) and
nothing of another tenant's; platform admins find the platform's own lines; the context, tail
and histogram parts; bad input and a store that is down are messages, never a 500."""

import logging
import re

import pytest
from django.urls import reverse

from aistation.logstore.base import StoreDown
from aistation.logstore.handler import platform_buffer
from aistation.services.log_shipping import logs_ship
from frontend.views.logs import highlighted

HTMX = {"HTTP_HX_REQUEST": "true"}
LOGS = reverse("frontend:logs")


@pytest.fixture
def running(farm, log_store):
    """An alpha job running on the fake cluster, its workload id at hand."""
    job = farm.submit(name="trainer")
    farm.cycle()
    job.refresh_from_db()
    job.workload = job.attempts.order_by("-number").first().workload_id
    return job


def _ship(farm, job, *texts):
    for text in texts:
        farm.fake.append_log(job.workload, text)
    logs_ship()


def _hits(response) -> list[str]:
    """The text of each line found, as the page shows it (marks and escapes kept)."""
    return re.findall(r'<pre class="log-hit-text">(.*?)</pre>', response.content.decode(), re.S)


def test_a_member_finds_their_jobs_line_with_the_words_marked(signed_in, farm, running):
    _ship(farm, running, "step 1 loss 2.5", "NCCL WARN net ib0 flapped", "step 2 loss 2.1")
    client = signed_in(farm.world.alpha_member)
    response = client.get(LOGS, {"q": "nccl warn"})
    assert response.status_code == 200
    assert _hits(response) == ["<mark>NCCL</mark> <mark>WARN</mark> net ib0 flapped"]
    content = response.content.decode()
    assert f'href="/jobs/{running.pk}/?attempt=1&amp;replica=0"' in content
    assert 'class="chart"' in content and "1 matching line" in content
    # The results area alone for htmx, the same lines in it.
    partial = client.get(LOGS, {"q": "nccl warn"}, **HTMX)
    assert 'class="sidebar"' not in partial.content.decode()
    assert _hits(partial) == _hits(response)
    assert "Vary" in partial and "HX-Request" in partial["Vary"]


def test_the_page_renders_for_every_role_and_is_in_the_navigation(signed_in, farm, running):
    for user in (farm.world.alpha_viewer, farm.world.beta_member, farm.world.operator):
        response = signed_in(user).get(LOGS)
        assert response.status_code == 200, user
        sections = {section.label: [link.label for link in section.links]
                    for section in response.context["nav_sections"]}
        assert "Logs" in sections["Jobs"]


def test_anonymous_users_are_sent_to_login(client, db):
    response = client.get(LOGS)
    assert response.status_code == 302
    assert response.url.startswith(reverse("frontend:login"))


def test_another_tenant_sees_none_of_alphas_lines(signed_in, farm, running):
    _ship(farm, running, "alpha secret token-xyz in NCCL init")
    assert _hits(signed_in(farm.world.alpha_member).get(LOGS, {"q": "secret"}))
    client = signed_in(farm.world.beta_member)
    for params in ({}, {"q": "secret"}, {"q": "NCCL", "range": "30d"}, {"level": "info"},
                   {"q": "alpha", "live": "on"}, {"since": "7d"}):
        response = client.get(LOGS, params)
        assert response.status_code == 200, params
        assert _hits(response) == [], params
        assert "token-xyz" not in response.content.decode(), params
    # A job beta may not see is no job: a form message, not a 404 page, nor its lines.
    response = client.get(LOGS, {"job": running.pk, "q": "secret"})
    assert response.status_code == 200
    assert f"No job {running.pk}." in response.content.decode()
    assert _hits(response) == []
    # Beta sees alpha's jobs' context and tail no more than its search.
    context = client.get(LOGS, {"part": "context", "job": running.pk, "attempt": 1,
                                "replica": 0, "line": 2}, **HTMX)
    assert context.status_code == 404
    tail = client.get(LOGS, {"part": "tail", "since": "1h", "after": 0}, **HTMX)
    assert tail.status_code == 200 and _hits(tail) == []
    assert client.get(LOGS, {"part": "tail", "job": running.pk, "since": "1h", "after": 0},
                      **HTMX).status_code == 404


def test_platform_lines_are_for_platform_admins(signed_in, farm, running, log_store):
    logging.getLogger("ogai.test").warning("disk pressure on the scheduler host")
    platform_buffer().flush(log_store)
    response = signed_in(farm.world.operator, farm.world.alpha).get(
        LOGS, {"q": '"disk pressure"', "source": "web"})
    assert _hits(response) == ["<mark>disk pressure</mark> on the scheduler host"]
    content = response.content.decode()
    assert '<span class="badge badge-accent">web</span>' in content
    assert 'name="request_id"' in content and 'name="source"' in content
    member = signed_in(farm.world.alpha_member).get(LOGS, {"q": "disk pressure"})
    assert _hits(member) == []
    # Members are offered neither the source nor the request id.
    assert 'name="source"' not in member.content.decode()
    assert 'name="request_id"' not in member.content.decode()
    assert _hits(signed_in(farm.world.alpha_member).get(
        LOGS, {"q": "disk", "source": "web"})) == []


def test_the_context_part_shows_the_lines_around_the_hit(signed_in, farm, running):
    _ship(farm, running, *[f"line {i}" + (" OOM here" if i == 30 else "") for i in range(1, 61)])
    client = signed_in(farm.world.alpha_member)
    page = client.get(LOGS, {"q": "OOM"}).content.decode()
    url = re.search(r'hx-get="([^"]*part=context[^"]*)"', page)[1].replace("&amp;", "&")
    response = client.get(url, **HTMX)
    assert response.status_code == 200
    content = response.content.decode()
    numbers = [int(n) for n in re.findall(r'data-line="(\d+)"', content)]
    hit = int(re.search(r'class="is-hit" aria-current="true" data-line="(\d+)"', content)[1])
    assert numbers == list(range(hit - 20, hit + 21))
    texts = _hits(response)
    assert texts[20] == "<strong>line 30 <mark>OOM</mark> here</strong>"
    assert texts[19] == "line 29" and texts[21] == "line 31"
    assert 'class="sidebar"' not in content


def test_the_tail_part_brings_only_newer_lines(signed_in, farm, running):
    _ship(farm, running, "epoch 1 done")
    client = signed_in(farm.world.alpha_member)
    page = client.get(LOGS, {"q": "epoch", "live": "on"})
    content = page.content.decode()
    assert 'hx-trigger="every 2s"' in content
    url = re.search(r'id="log-tail"[^>]*hx-get="([^"]*)"', content)[1].replace("&amp;", "&")
    assert _hits(client.get(url, **HTMX)) == []
    _ship(farm, running, "epoch 2 done", "not this one", "epoch 3 done")
    tail = client.get(url, **HTMX)
    assert tail.status_code == 200
    # Newest first, as they go on top of the list; the poller comes back after them.
    assert _hits(tail) == ["<mark>epoch</mark> 3 done", "<mark>epoch</mark> 2 done"]
    tail_content = tail.content.decode()
    assert 'hx-swap-oob="true"' in tail_content
    after = re.search(r'id="log-tail"[^>]*hx-get="([^"]*)"', tail_content)[1].replace("&amp;", "&")
    assert after != url
    assert _hits(client.get(after, **HTMX)) == []


def test_a_live_tail_with_an_until_is_a_form_message(signed_in, world, log_store):
    response = signed_in(world.alpha_member).get(
        LOGS, {"live": "on", "since": "2h", "until": "1h"})
    assert "leave until empty" in response.content.decode()


def test_html_in_a_log_line_is_escaped(signed_in, farm, running):
    _ship(farm, running, '<script>alert("owned")</script> <b>bold</b> & more')
    client = signed_in(farm.world.alpha_member)
    response = client.get(LOGS, {"q": "alert"})
    content = response.content.decode()
    assert "<script>alert" not in content and "<b>bold</b>" not in content
    assert _hits(response) == [
        "&lt;script&gt;<mark>alert</mark>(&quot;owned&quot;)&lt;/script&gt; "
        "&lt;b&gt;bold&lt;/b&gt; &amp; more"]
    assert str(highlighted("a<b", (("b",),))) == "a&lt;<mark>b</mark>"


@pytest.mark.parametrize("params,message", [
    ({"q": '"open'}, "A quote is not closed"),
    ({"since": "yesterday"}, "Give a time as 7d"),
    ({"since": "1h", "until": "2h"}, "Give an until after since"),
    ({"job": "99999999999999999999"}, "Job:"),
    ({"job": "999999"}, "No job 999999."),
    ({"level": "loud"}, "Level:"),
    ({"range": "job"}, "Name a job"),
])
def test_bad_input_is_a_form_message(signed_in, world, log_store, params, message):
    response = signed_in(world.alpha_member).get(LOGS, params)
    assert response.status_code == 200
    assert message in response.content.decode()


def test_a_job_named_searches_its_whole_life(signed_in, farm, running):
    _ship(farm, running, "from the start")
    response = signed_in(farm.world.alpha_member).get(LOGS, {"job": running.pk})
    assert response.context["window"].key == "job"
    assert "<pre class=\"log-hit-text\">from the start</pre>" in response.content.decode()
    job_page = signed_in(farm.world.alpha_member).get(reverse("frontend:job", args=[running.pk]))
    assert f'href="/logs/?job={running.pk}"' in job_page.content.decode()


def test_a_bar_of_the_histogram_narrows_the_search_to_its_time(signed_in, farm, running):
    _ship(farm, running, "checkpoint saved")
    client = signed_in(farm.world.alpha_member)
    content = client.get(LOGS, {"q": "checkpoint", "range": "1h"}).content.decode()
    zoom = re.search(r'<a href="(/logs/\?[^"]*range=custom[^"]*)"><rect', content)[1]
    narrowed = client.get(zoom.replace("&amp;", "&"))
    assert narrowed.context["window"].key == "custom"
    assert _hits(narrowed) == ["<mark>checkpoint</mark> saved"]


def test_a_store_that_is_down_is_a_message_not_a_500(signed_in, world, log_store, monkeypatch):
    def down(*_args, **_kwargs):
        raise StoreDown("log store: connection refused")

    monkeypatch.setattr(type(log_store), "search", down)
    client = signed_in(world.alpha_member)
    response = client.get(LOGS, {"q": "x"})
    assert response.status_code == 200
    assert "The log store cannot be reached" in response.content.decode()
    tail = client.get(LOGS, {"part": "tail", "since": "1h", "after": 5}, **HTMX)
    assert tail.status_code == 200 and "cannot be reached" in tail.content.decode()


def test_the_quotas_page_shows_what_the_tenants_logs_take(signed_in, farm, running,
                                                          log_store, monkeypatch):
    _ship(farm, running, "x" * 999)
    response = signed_in(farm.world.alpha_member, farm.world.alpha).get(
        reverse("frontend:quotas"))
    assert response.context["log_bytes"] >= 1000
    assert "data-log-usage" in response.content.decode()

    def down(*_args, **_kwargs):
        raise StoreDown("log store: connection refused")

    monkeypatch.setattr(type(log_store), "usage", down)
    response = signed_in(farm.world.alpha_member, farm.world.alpha).get(
        reverse("frontend:quotas"))
    assert response.context["log_bytes"] is None
    assert "unknown" in response.content.decode()
