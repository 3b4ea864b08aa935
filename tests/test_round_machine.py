"""The round's state machine (aggregator.rounds.states, aggregator.rounds.transitions): the
table of legal changes is complete and closed, and the one transition function refuses any
change outside it, before anything is written."""

from __future__ import annotations

import pytest

from aggregator.rounds.states import (CONSENT, DONE, FAILED, FINAL, FITTING, OPEN, RELEASE,
                                      SECURE_STEPS, STATE_TO_PB, STEP_STATE, TRANSITIONS,
                                      IllegalTransition, check_transition, legal, next_phase)
from dpfed.v1 import dpfed_pb2 as pb

START = (CONSENT, "")


def _successors(phase):
    ways = list(TRANSITIONS[phase])
    if legal(phase, (FAILED, "")):
        ways.append((FAILED, ""))
    return ways


def test_the_table_reaches_every_phase_and_ends_only_in_done_or_failed():
    seen, todo = {START}, [START]
    while todo:
        for nxt in _successors(todo.pop()):
            assert nxt in TRANSITIONS, f"{nxt} is entered but has no row"
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert seen == set(TRANSITIONS)                        # every phase is reachable
    states = {state for state, _ in seen}
    assert states == set(STATE_TO_PB) - {OPEN}             # every state but the legacy one
    for state in FINAL:                                    # DONE and FAILED are final
        assert _successors((state, "")) == []
    for phase in set(TRANSITIONS) - {(DONE, ""), (FAILED, "")}:
        assert (FAILED, "") in _successors(phase)          # any phase may fail...
        reach, todo = {phase}, [phase]                     # ...and every one can finish
        while todo:
            for nxt in _successors(todo.pop()):
                if nxt not in reach:
                    reach.add(nxt)
                    todo.append(nxt)
        assert (DONE, "") in reach


def test_the_secure_steps_follow_each_other_in_their_states():
    path, phase = [], next_phase(START, secure=True)
    while phase[1]:
        assert STEP_STATE[phase[1]] == phase[0]
        path.append(phase[1])
        phase = next_phase(phase, secure=True)
    assert tuple(path) == SECURE_STEPS and phase == (FITTING, "")
    assert next_phase(START, secure=False) == (RELEASE, "")
    assert next_phase((RELEASE, ""), secure=False) == (FITTING, "")
    assert next_phase((FITTING, ""), secure=False) == (DONE, "")


@pytest.mark.parametrize("old, new", [
    ((CONSENT, ""), (FITTING, "")),          # skipping the release
    ((CONSENT, ""), (DONE, "")),
    ((RELEASE, ""), (CONSENT, "")),          # going back
    ((RELEASE, ""), (RELEASE, "release")),   # an independent round has no steps
    (("KEYS", "advertise"), ("RELEASE", "release")),   # skipping share_keys
    (("UNMASK", "confirm"), (FITTING, "")),  # unmasking without the unmask step
    ((DONE, ""), (FAILED, "")),              # out of a final state
    ((FAILED, ""), (FAILED, "")),
    ((FAILED, ""), (DONE, "")),
])
def test_an_illegal_transition_is_refused(old, new):
    assert not legal(old, new)
    with pytest.raises(IllegalTransition):
        check_transition(old, new)


def test_the_transition_function_refuses_before_writing_anything(federation):
    """Transitions.enter, the only code that changes a round's state, refuses a change the
    table does not hold: nothing is stored, nothing in memory changes, no timer is lost."""
    manager = federation.manager
    federation.start_round(federation.spec(quorum=2), consent=False)
    live = manager.context.rounds["r1"]
    before = (live.stored.state, list(map(list, live.stored.phases)), live.timer)
    with manager.context.lock:
        for target in ((FITTING, ""), (DONE, ""), (RELEASE, "release")):
            with pytest.raises(IllegalTransition):
                manager.transitions.enter(live, target, "skipped")
    assert (live.stored.state, live.stored.phases, live.timer) == before
    assert manager.store.get_round("r1").state == CONSENT
    assert live.timer.is_alive()
    assert manager.status("r1").state == pb.RoundStatus.CONSENT
    with manager.context.lock:                              # a legal one goes through
        manager.transitions.fail(live, "stopped by the test")
    assert manager.store.get_round("r1").state == FAILED
    with manager.context.lock, pytest.raises(IllegalTransition):
        manager.transitions.fail(live, "twice")             # FAILED is final
    assert manager.status("r1").message == "stopped by the test"
