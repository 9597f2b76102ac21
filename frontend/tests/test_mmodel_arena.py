"""The arena: Elo ratings replayed from votes, refusals of bad votes, and the playground's vote
view."""

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.urls import reverse

from infra_os.models import AuditEvent
from mmodel.choices import VersionSource, VersionStatus, WeightsFormat
from mmodel.models import ArenaVote, Model, ModelVersion
from mmodel.selectors.arena import arena_ratings
from mmodel.services.arena import arena_vote_record


def _version(tenant, name: str) -> ModelVersion:
    model = Model.objects.create(tenant=tenant, name=name)
    return ModelVersion.objects.create(model=model, number=1, status=VersionStatus.READY,
                                       source=VersionSource.IMPORT,
                                       format=WeightsFormat.SAFETENSORS)


@pytest.fixture
def versions(world):
    return {name: _version(world.alpha, name) for name in ("a", "b", "c")} | {
        "beta": _version(world.beta, "other")}


def _vote(world, left, right, vote, prompt="Hi"):
    return arena_vote_record(actor=world.alpha_member, tenant=world.alpha, left_version=left,
                             right_version=right, vote=vote, prompt=prompt)


def test_elo_ratings_of_a_hand_computed_sequence(world, versions):
    a, b, c = versions["a"], versions["b"], versions["c"]
    # By hand, from 1000 each with K=32 and E = 1 / (1 + 10^((R_other - R) / 400)):
    # 1. a beats b: E = 0.5, a = 1016, b = 984.
    # 2. b ties c: E_b = 1 / (1 + 10^(16/400)) = 0.47700; b = 984.736, c = 999.264.
    # 3. c (right) beats a: E_a = 0.52404; a = 1016 - 16.769 = 999.231, c = 1016.033.
    # 4. c and b both bad, a draw: E_c = 0.54490; c = 1014.596, b = 986.174.
    _vote(world, a, b, "left")
    _vote(world, b, c, "tie")
    _vote(world, a, c, "right")
    _vote(world, c, b, "both_bad")
    rows = arena_ratings(tenant=world.alpha)
    assert [row["version"] for row in rows] == [c, a, b]
    ratings = {row["version"].model.name: row for row in rows}
    assert ratings["c"]["rating"] == pytest.approx(1014.596, abs=0.01)
    assert ratings["a"]["rating"] == pytest.approx(999.231, abs=0.01)
    assert ratings["b"]["rating"] == pytest.approx(986.174, abs=0.01)
    assert (ratings["a"]["votes"], ratings["a"]["wins"], ratings["a"]["losses"],
            ratings["a"]["ties"]) == (2, 1, 1, 0)
    assert (ratings["b"]["wins"], ratings["b"]["losses"], ratings["b"]["ties"]) == (0, 1, 2)
    assert (ratings["c"]["wins"], ratings["c"]["losses"], ratings["c"]["ties"]) == (1, 0, 2)
    # Another tenant's votes are its own.
    assert arena_ratings(tenant=world.beta) == []


def test_a_vote_is_audited(world, versions):
    vote = _vote(world, versions["a"], versions["b"], "right", prompt="Which is bigger?")
    assert (vote.left, vote.right, vote.vote, vote.prompt) == (
        versions["a"], versions["b"], "right", "Which is bigger?")
    event = AuditEvent.objects.get(action="arena.vote")
    assert event.tenant == world.alpha and event.actor == world.alpha_member
    assert event.changes == {"left": "a:v1", "right": "b:v1", "vote": "right"}


@pytest.mark.parametrize(("left", "right", "vote", "field"), [
    ("a", "a", "left", "right_version"),
    ("a", "beta", "left", "right_version"),
    ("beta", "a", "tie", "left_version"),
    ("a", "b", "sideways", "vote"),
])
def test_bad_votes_are_refused_naming_the_field(world, versions, left, right, vote, field):
    with pytest.raises(ValidationError) as refused:
        _vote(world, versions[left], versions[right], vote)
    assert field in refused.value.message_dict
    assert not ArenaVote.objects.exists()


def test_viewers_and_strangers_cannot_vote(world, versions):
    with pytest.raises(PermissionDenied):
        arena_vote_record(actor=world.alpha_viewer, tenant=world.alpha,
                          left_version=versions["a"], right_version=versions["b"], vote="left")
    assert not ArenaVote.objects.exists()


def test_the_vote_view_answers_with_the_new_ratings(signed_in, world, versions):
    client = signed_in(world.alpha_member)
    url = reverse("frontend:arena-vote")
    data = {"left_version": versions["a"].pk, "right_version": versions["b"].pk,
            "vote": "left", "prompt": "Hello"}
    response = client.post(url, data, HTTP_X_REQUESTED_WITH="playground")
    assert response.status_code == 200
    content = response.content.decode()
    assert 'id="arena-ratings"' in content and "Vote recorded" in content
    assert 'data-rating-version="a:v1" data-rating="1016.0"' in content
    assert 'data-rating-version="b:v1" data-rating="984.0"' in content
    # The same version on both sides: 400 and the reason, nothing recorded.
    same = client.post(url, data | {"right_version": versions["a"].pk},
                       HTTP_X_REQUESTED_WITH="playground")
    assert same.status_code == 400
    assert "two different versions" in same.content.decode()
    # Another tenant's version is no choice at all.
    foreign = client.post(url, data | {"right_version": versions["beta"].pk},
                          HTTP_X_REQUESTED_WITH="playground")
    assert foreign.status_code == 400
    assert ArenaVote.objects.count() == 1
    # A plain form post goes back to the playground.
    plain = client.post(url, data)
    assert plain.status_code == 302 and plain["Location"] == reverse("frontend:playground")
    assert ArenaVote.objects.count() == 2


def test_viewers_cannot_post_a_vote(signed_in, world, versions):
    response = signed_in(world.alpha_viewer).post(reverse("frontend:arena-vote"), {
        "left_version": versions["a"].pk, "right_version": versions["b"].pk, "vote": "left"})
    assert response.status_code == 403
    assert not ArenaVote.objects.exists()
