"""A round's states, its secure steps, and the one table of the changes between them.

Phases (docs/protocol.md):

    CONSENT --> RELEASE ---------------------------------------------> FITTING --> DONE
        \\                                                          /
         `--> KEYS (advertise, share_keys) --> RELEASE (release) --> UNMASK (confirm, unmask)

and FAILED from any of them before DONE. The lower path is a secure round's
(spec.aggregation = "secure"): its states are split into the steps of the secure-aggregation
core (``LiveRound.step``), each with its own deadline. OPEN is the state of rounds stored
before phases existed: they are read as RELEASE with every invited site selected.

``TRANSITIONS`` is the only place that says which change is legal, and
aggregator.rounds.transitions.Transitions.enter, the only code that changes a round's state,
refuses any other (``IllegalTransition``).
"""

from __future__ import annotations

from dpfed.v1 import dpfed_pb2 as pb

CONSENT, RELEASE, FITTING, DONE, FAILED = "CONSENT", "RELEASE", "FITTING", "DONE", "FAILED"
KEYS, UNMASK = "KEYS", "UNMASK"   # secure aggregation only
OPEN = "OPEN"   # legacy (stored before phases): recovered as RELEASE
STATE_TO_PB = {CONSENT: pb.RoundStatus.CONSENT, RELEASE: pb.RoundStatus.RELEASE,
               FITTING: pb.RoundStatus.FITTING, DONE: pb.RoundStatus.DONE,
               FAILED: pb.RoundStatus.FAILED, OPEN: pb.RoundStatus.OPEN,
               KEYS: pb.RoundStatus.KEYS, UNMASK: pb.RoundStatus.UNMASK}
# States in which the round still takes answers from sites.
COLLECTING = (CONSENT, KEYS, RELEASE, UNMASK)
# States of a secure round that are split into steps.
SECURE_STATES = (KEYS, RELEASE, UNMASK)
# Secure steps (LiveRound.step), the state each belongs to, and the share of the time left
# that each gets as its deadline (docs/protocol.md, "Secure rounds").
ADVERTISE, SHARE_KEYS, RELEASE_STEP = "advertise", "share_keys", "release"
CONFIRM_STEP, UNMASK_STEP = "confirm", "unmask"
SECURE_STEPS = (ADVERTISE, SHARE_KEYS, RELEASE_STEP, CONFIRM_STEP, UNMASK_STEP)
STEP_STATE = {ADVERTISE: KEYS, SHARE_KEYS: KEYS, RELEASE_STEP: RELEASE, CONFIRM_STEP: UNMASK,
              UNMASK_STEP: UNMASK}
STEP_WEIGHT = {ADVERTISE: 1, SHARE_KEYS: 1, RELEASE_STEP: 2, CONFIRM_STEP: 1, UNMASK_STEP: 1}
# The PhaseMessage phase a site answers each step's notice with, and the notice's phase.
STEP_NOTICE = {ADVERTISE: "keys", SHARE_KEYS: "share_keys", RELEASE_STEP: "release",
               CONFIRM_STEP: "confirm", UNMASK_STEP: "unmask"}

# Where each phase -- (state, secure step), step "" outside a secure round's steps -- goes when
# it ends with what it waited for. FAILED is the other way out of every phase but DONE, and
# DONE and FAILED are final. CONSENT has two ways on: RELEASE for independent releases, the
# key agreement for a secure round.
TRANSITIONS: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {
    (CONSENT, ""): ((RELEASE, ""), (KEYS, ADVERTISE)),
    (RELEASE, ""): ((FITTING, ""),),
    (KEYS, ADVERTISE): ((KEYS, SHARE_KEYS),),
    (KEYS, SHARE_KEYS): ((RELEASE, RELEASE_STEP),),
    (RELEASE, RELEASE_STEP): ((UNMASK, CONFIRM_STEP),),
    (UNMASK, CONFIRM_STEP): ((UNMASK, UNMASK_STEP),),
    (UNMASK, UNMASK_STEP): ((FITTING, ""),),
    (FITTING, ""): ((DONE, ""),),
    (DONE, ""): (),
    (FAILED, ""): (),
}
FINAL = (DONE, FAILED)


class IllegalTransition(RuntimeError):
    """A change of state that TRANSITIONS does not allow (a bug, never a site's doing)."""


def legal(old: tuple[str, str], new: tuple[str, str]) -> bool:
    """Whether a round in phase ``old`` may go to phase ``new`` (both (state, step))."""
    if new == (FAILED, ""):
        return old[0] not in FINAL
    return new in TRANSITIONS.get(old, ())


def check_transition(old: tuple[str, str], new: tuple[str, str]) -> None:
    """Raise IllegalTransition unless ``old`` -> ``new`` is in TRANSITIONS."""
    if not legal(old, new):
        raise IllegalTransition(f"no transition from {'/'.join(filter(None, old))} to "
                                f"{'/'.join(filter(None, new))}")


def next_phase(old: tuple[str, str], *, secure: bool) -> tuple[str, str]:
    """Where phase ``old`` goes when it ends with what it waited for (``secure``: the round's
    spec says aggregation = "secure"; it matters only at the end of CONSENT)."""
    ways = TRANSITIONS[old]
    return ways[-1] if secure else ways[0]
