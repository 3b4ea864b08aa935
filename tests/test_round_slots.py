"""aggregator.rounds.slots.check_slot: the one check of a site's slot that the releases and
the secure steps share (refused, answer taken, answer being stored, not in the step)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from aggregator.errors import Rejected
from aggregator.rounds.slots import check_slot


def _live(expected=("a", "b", "c", "d"), refusals=("d",)):
    return SimpleNamespace(stored=SimpleNamespace(round_id="r1"), refusals=dict.fromkeys(refusals),
                           step="confirm", state="UNMASK", expected=lambda: frozenset(expected))


@pytest.mark.parametrize("site, code, words", [
    ("d", "ALREADY_EXISTS", "site 'd' refused round 'r1'"),
    ("a", "ALREADY_EXISTS", "site 'a' already sent its confirm message for round 'r1'"),
    ("b", "UNAVAILABLE", "being stored; retry"),
    ("e", "FAILED_PRECONDITION", "not in the confirm step of round 'r1'"),
])
def test_each_refusal_names_its_reason(site, code, words):
    with pytest.raises(Rejected) as info:
        check_slot(_live(), site, answered={"a": 1}, storing={"b": object()},
                   what="confirm message")
    assert info.value.code == code and words in info.value.message


def test_a_free_slot_passes_and_refusal_comes_first():
    check_slot(_live(), "c", answered={"a": 1}, storing={"b": 1}, what="release")
    # A site that refused after answering is told it refused (the cheapest, final reason).
    with pytest.raises(Rejected) as info:
        check_slot(_live(refusals=("a",)), "a", answered={"a": 1}, storing={}, what="release")
    assert "refused" in info.value.message
