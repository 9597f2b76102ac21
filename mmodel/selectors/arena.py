"""Reads of MModel's arena, scoped to the caller's tenants."""

from dataclasses import dataclass
from typing import Any

from infra_os.models import Tenant
from mmodel.choices import Vote
from mmodel.models import ArenaVote, ModelVersion

INITIAL_RATING = 1000.0
K_FACTOR = 32.0
# What the left side scores for each vote; the right side scores one minus it.
LEFT_SCORE = {Vote.LEFT: 1.0, Vote.RIGHT: 0.0, Vote.TIE: 0.5, Vote.BOTH_BAD: 0.5}


@dataclass
class _Standing:
    rating: float = INITIAL_RATING
    votes: int = 0
    wins: int = 0
    losses: int = 0
    ties: int = 0


def expected_score(rating: float, opponent: float) -> float:
    return 1.0 / (1.0 + 10.0 ** ((opponent - rating) / 400.0))


def arena_ratings(*, tenant: Tenant) -> list[dict[str, Any]]:
    """Elo ratings of the tenant's versions from its playground votes, best first:
    `[{"version", "rating", "votes", "wins", "losses", "ties"}]`, versions without votes
    left out.

    Every version starts at 1000; the votes are replayed in the order they were cast, each
    moving both sides by K=32 times (score - expected score). "Tie" and "both bad" both count
    as a draw (0.5 each): a vote that neither answer was good says nothing about which of the
    two is better. A draw between two versions rated alike changes neither rating."""
    standings: dict[int, _Standing] = {}
    votes = ArenaVote.objects.filter(tenant=tenant).order_by("created_at", "id") \
        .values_list("left_id", "right_id", "vote")
    for left_id, right_id, vote in votes.iterator():
        left = standings.setdefault(left_id, _Standing())
        right = standings.setdefault(right_id, _Standing())
        score = LEFT_SCORE[Vote(vote)]
        expected = expected_score(left.rating, right.rating)
        # Both changes from the ratings before this vote.
        left.rating, right.rating = (left.rating + K_FACTOR * (score - expected),
                                     right.rating + K_FACTOR * (expected - score))
        for side, side_score in ((left, score), (right, 1.0 - score)):
            side.votes += 1
            if side_score == 1.0:
                side.wins += 1
            elif side_score == 0.0:
                side.losses += 1
            else:
                side.ties += 1
    versions = ModelVersion.objects.select_related("model").in_bulk(list(standings))
    rows: list[dict[str, Any]] = [
        {"version": versions[pk], "rating": standing.rating, "votes": standing.votes,
         "wins": standing.wins, "losses": standing.losses, "ties": standing.ties}
        for pk, standing in standings.items() if pk in versions
    ]
    rows.sort(key=lambda row: (-row["rating"], row["version"].label))
    return rows
