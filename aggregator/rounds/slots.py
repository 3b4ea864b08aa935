"""A site's slot in the step a round is in: the checks that every phase taking one answer
per site makes before it reserves the site's slot. The releases (aggregator.rounds.release,
plain or masked) and the messages of a secure round's key and unmasking steps
(aggregator.rounds.secure_steps) share this one implementation, so their rules cannot drift:

* a site that refused the round answers nothing more;
* an answer already taken is not taken twice (an identical resent release is answered as a
  duplicate before this check: aggregator.rounds.release);
* while a site's answer is being stored (group commit, outside the lock) a retry is told to
  wait (UNAVAILABLE, retryable);
* only the sites the step waits for may answer (``LiveRound.expected``: the participants,
  then the secagg session's current set; a site that missed an earlier step is not in it).

The checks that come before (the round's phase, the site's invitation, the spec digest) and
freshness, checked last, stay with each phase: their order and wording are the phase's own.
"""

from __future__ import annotations

from collections.abc import Container

from aggregator.errors import Rejected
from aggregator.rounds.live import LiveRound


def check_slot(live: LiveRound, site: str, *, answered: Container[str],
               storing: Container[str], what: str) -> None:
    """Rejected unless ``site`` may answer the step ``live`` is in: not refused, no answer in
    ``answered`` (taken) or ``storing`` (being stored), one of ``live.expected()``. ``what``
    names the answer in the messages ("release", "advertise message", ...). Call under the
    round lock."""
    rid = live.stored.round_id
    if site in live.refusals:
        raise Rejected("ALREADY_EXISTS", f"site {site!r} refused round {rid!r}")
    if site in answered:
        raise Rejected("ALREADY_EXISTS", f"site {site!r} already sent its {what} for round "
                                         f"{rid!r}")
    if site in storing:
        raise Rejected("UNAVAILABLE", f"the {what} of site {site!r} to round {rid!r} is being "
                                      f"stored; retry")
    if site not in live.expected():
        step = live.step or live.state
        raise Rejected("FAILED_PRECONDITION", f"site {site!r} is not in the {step} step of "
                                              f"round {rid!r} (it missed an earlier step)")
