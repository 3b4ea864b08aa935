"""When each phase of a round ends at the latest. The timers are armed, and a deadline that
passed is carried out, by aggregator.rounds.transitions.Transitions (``arm``,
``on_deadline``)."""

from __future__ import annotations

from dpfed.v1 import dpfed_pb2 as pb

from aggregator.rounds.live import LiveRound
from aggregator.rounds.states import CONSENT, SECURE_STEPS, STEP_WEIGHT

# Default length of the consent phase: a third of the time to the deadline, within these.
MIN_CONSENT_MS, MAX_CONSENT_MS = 5_000, 120_000


def consent_deadline_ms(spec: pb.RoundSpec, started_ms: int) -> int:
    """When the consent phase of ``spec`` ends: the spec's consent_deadline_unix_ms, or a third
    of the time to the deadline (at least 5 s, at most 120 s), never after the deadline."""
    if spec.consent_deadline_unix_ms:
        return spec.consent_deadline_unix_ms
    span = (spec.deadline_unix_ms - started_ms) // 3
    return min(spec.deadline_unix_ms, started_ms + max(MIN_CONSENT_MS, min(MAX_CONSENT_MS, span)))


def step_deadline(live: LiveRound, step: str, now: int) -> int:
    """When secure ``step``, starting at ``now``, ends: its weight's share of the time left to
    the round's deadline, shared with the steps after it (advertise 1, share_keys 1, release 2,
    confirm 1, unmask 1)."""
    remaining = max(0, live.stored.deadline_ms - now)
    rest = SECURE_STEPS[SECURE_STEPS.index(step):]
    return now + remaining * STEP_WEIGHT[step] // sum(STEP_WEIGHT[s] for s in rest)


def phase_deadline(live: LiveRound) -> int:
    """When the current phase ends (ms): the consent deadline in CONSENT, a secure step's own
    (stored with the step), else the round's deadline."""
    if live.state == CONSENT:
        return consent_deadline_ms(live.spec, live.stored.started_ms)
    if live.step:
        return live.stored.phase_deadline_ms
    return live.stored.deadline_ms
