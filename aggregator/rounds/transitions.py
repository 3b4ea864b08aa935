"""The one place a round changes state: when a phase ends, where it goes, and what entering a
state starts.

* ``close_if_due`` (called under the lock by whatever may end the current phase: an answer
  that was stored, a commit that failed, a refusal, a deadline) ends the phase when every site
  it waits for answered, or its deadline passed; never while an answer is being stored.
* The phase goes where aggregator.rounds.states.TRANSITIONS says (``next_phase``) when it ended
  with what it waited for, and to FAILED, saying why, when it did not.
* ``enter`` is the only code that changes a round's state. It refuses a change the table does
  not hold, then writes the change in one store transaction, then changes the memory (so the
  in-memory view never runs ahead of what a restart would reload), then starts the new state:
  a collecting state wakes the sites it waits for and arms its deadline, FITTING queues the
  fit (one at a time, on its own thread; aggregator.rounds.fitting.fit_round), which enters DONE.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from dpfed import secure_round
from dpfed.secagg import errors as secagg_errors

from aggregator.rounds import secure_session
from aggregator.rounds.context import RoundContext
from aggregator.rounds.deadlines import phase_deadline, step_deadline
from aggregator.rounds.fitting import fit_round
from aggregator.rounds.live import LiveRound
from aggregator.rounds.states import (COLLECTING, CONSENT, DONE, FAILED, FITTING, RELEASE,
                                      SECURE_STATES, UNMASK_STEP, check_transition, next_phase)

log = logging.getLogger(__name__)


class Transitions:
    def __init__(self, ctx: RoundContext):
        self.ctx = ctx
        # One fit at a time: PyMC is CPU-bound and the machine small; rounds queue up.
        self._fit_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fit")

    # ---- the one transition function ----
    def enter(self, live: LiveRound, phase: tuple[str, str], message: str = "", *,
              participants: list[str] | None = None, result=None, fit_s: float | None = None
              ) -> None:
        """Under the lock: move ``live`` to ``phase`` (state, secure step) -- durably, then in
        memory -- and start it. ``participants``: fixed as the consent phase ends; ``result``
        and ``fit_s``: the fit, stored with DONE."""
        check_transition(live.phase, phase)
        state, step = phase
        ctx, stored = self.ctx, live.stored
        now = ctx.now_ms()
        round_s = (now - stored.started_ms) / 1000 if state == FITTING else None
        due = step_deadline(live, step, now) if step else None
        if state != live.state:
            live.enter_phase(state, now)
        if state == DONE:
            ctx.store.finish_round(result, fit_s, phases=stored.phases)
        else:
            ctx.store.set_state(stored.round_id, state, message, round_s=round_s,
                                participants=participants, phases=stored.phases,
                                secure_step=step or None, phase_deadline_ms=due)
        stored.state, stored.message = state, message
        if participants is not None:
            stored.participants = list(participants)
            live.participants = frozenset(participants)
        if round_s is not None:
            stored.round_s = round_s
        if fit_s is not None:
            stored.fit_s = fit_s
        if step:
            stored.secure_step, stored.phase_deadline_ms = step, due
            secure_session.load_step(live)
        if live.timer:
            live.timer.cancel()
        if state in COLLECTING:
            ctx.notify(live.expected(), stored.round_id)
            self.arm(stored.round_id)
        elif state == FITTING:
            log.info("round %s: closed after %.3f s: %s", stored.round_id, round_s, message)
            self.submit_fit(stored.round_id)
        elif state == FAILED:
            log.warning("round %s: FAILED: %s", stored.round_id, message)

    def fail(self, live: LiveRound, message: str) -> None:
        """Under the lock: the round ends FAILED, saying why."""
        self.enter(live, (FAILED, ""), message)

    # ---- deadlines ----
    def arm(self, round_id: str) -> None:
        """The timer of the current phase (aggregator.rounds.deadlines.phase_deadline)."""
        with self.ctx.lock:
            live = self.ctx.rounds[round_id]
            if live.state not in COLLECTING or self.ctx.closed:
                return
            delay = max(0.0, (phase_deadline(live) - self.ctx.now_ms()) / 1000)
            live.timer = threading.Timer(delay, self.on_deadline,
                                         args=(round_id, live.state, live.step))
            live.timer.daemon = True
            live.timer.start()

    def on_deadline(self, round_id: str, state: str | None = None, step: str = "") -> None:
        """The deadline of phase (``state``, ``step``) passed: carried out now, or by the last
        answer being stored (``deadline_due``). Ignored if that phase already ended."""
        with self.ctx.lock:
            live = self.ctx.rounds[round_id]
            if live.state not in COLLECTING or self.ctx.closed:
                return
            if state is not None and live.phase != (state, step):
                return   # the timer of a phase that already ended
            live.deadline_due = True
            self.close_if_due(live)

    # ---- the end of each phase ----
    def close_if_due(self, live: LiveRound) -> None:
        """Under the lock, once nothing is being stored: end the current phase when every site
        it waits for answered, or when its deadline passed meanwhile; in the unmask step,
        as soon as every needed secret has its t shares."""
        if self.ctx.closed:
            return
        if live.state == CONSENT:
            if live.consents_storing:
                return
            if not live.any_missing():
                self._end_consent(live, "every invited site answered")
            elif live.deadline_due:
                self._end_consent(live, "consent deadline passed")
        elif live.secure is not None:
            if live.state not in SECURE_STATES or live.pending or live.storing:
                return
            if live.step == UNMASK_STEP and live.session.ready():
                self._finish_secure(live, "every needed share arrived")
            elif not live.any_missing():
                self._end_step(live, "every site answered")
            elif live.deadline_due:
                self._end_step(live, "its deadline passed")
        elif live.state == RELEASE and not live.storing:
            if not live.any_missing() or live.deadline_due:
                self._end_release(live)

    def _end_consent(self, live: LiveRound, why: str) -> None:
        """Fix the participants (the consenting sites) and go on to release (RELEASE, or KEYS
        for a secure round), or fail if fewer than the quorum consented or the secure session
        cannot be built (nobody has released: nobody paid)."""
        live.deadline_due = False   # the consent deadline's; the next phase arms its own
        consented = sorted(live.consents)
        refused = f"; refused: {', '.join(sorted(live.refusals))}" if live.refusals else ""
        if len(consented) < live.stored.quorum:
            self.fail(live, f"consent phase ended ({why}) with {len(consented)} consent(s), "
                            f"fewer than the quorum {live.stored.quorum}; no site released"
                            + refused + (f"; no answer: {', '.join(live.missing())}"
                                         if live.missing() else ""))
            return
        secure = secure_round.is_secure(live.spec)
        if secure:
            try:
                live.secure, live.session = secure_session.new_session(self.ctx, live,
                                                                       consented)
            except secure_round.SecureRoundError as exc:
                self.fail(live, f"consent phase ended ({why}) with {len(consented)} "
                                f"consent(s): {exc}; no site released" + refused)
                return
        self.enter(live, next_phase(live.phase, secure=secure), participants=consented)
        if secure:
            config = live.secure.config
            log.info("round %s: consent ended (%s): %d participant(s) agree keys (k = %d, "
                     "t = %d, T = %d, at least %d releases)", live.stored.round_id, why,
                     len(consented), config.degree, config.threshold, config.noise_threshold,
                     live.secure.floor)
        else:
            log.info("round %s: consent ended (%s): %d participant(s) release now",
                     live.stored.round_id, why, len(consented))

    def _end_release(self, live: LiveRound) -> None:
        """An independent round's release phase ended (every participant answered, or the
        deadline passed): fit the sum if it holds at least the quorum, else fail."""
        count, quorum, missing = len(live.contributions), live.stored.quorum, live.missing()
        if not missing:
            done = (f"every participant answered ({count} release(s) of "
                    f"{len(live.participants)} participant(s))")
            short = (f"{count} release(s), fewer than the quorum {quorum}; refused: "
                     f"{', '.join(sorted(live.refusals)) or 'none'}")
        else:
            done = f"deadline passed with quorum ({count}); dropped: {', '.join(missing)}"
            short = (f"deadline passed with {count} of quorum {quorum} release(s); dropped: "
                     f"{', '.join(missing)}" + (f"; refused: {', '.join(sorted(live.refusals))}"
                                                if live.refusals else ""))
        if count >= quorum:
            self.enter(live, next_phase(live.phase, secure=False), done)
        else:
            self.fail(live, short)

    def _end_step(self, live: LiveRound, why: str) -> None:
        """A secure step ended: close it in the session and go on to the next step, or fail
        with the secagg core's reason (the unmask step fails here: it ends early, with the
        sum, in ``_finish_secure``)."""
        step = live.step
        missing = live.missing()
        absent = f"; no answer from {', '.join(missing)}" if missing else ""
        if step == UNMASK_STEP:
            self.fail(live, f"unmasking ended ({why}) without the shares that remove the "
                            f"masks{absent}; the masked releases stay masked")
            return
        try:
            secure_session.close_step(live)
        except secagg_errors.SecAggError as exc:
            released = len(live.contributions)
            self.fail(live, f"{step} step ended ({why}): {exc}{absent}"
                            + (f"; {released} site(s) released and are accounted for"
                               if released else "; no site released"))
            return
        log.info("round %s: %s step ended (%s)%s", live.stored.round_id, step, why, absent)
        self.enter(live, next_phase(live.phase, secure=True))

    def _finish_secure(self, live: LiveRound, why: str) -> None:
        """Every needed secret has its shares: unmask the sum and fit it (a share that fails
        its commitment fails the round; too few survivors so far waits for more)."""
        try:
            secure_session.unmask(live)
        except secagg_errors.TooFewSurvivors:
            return
        except secagg_errors.SecAggError as exc:
            self.fail(live, f"unmasking failed: {type(exc).__name__}: {exc}")
            return
        result = live.session.result
        dropped = sorted(set(live.participants) - set(result.included))
        self.enter(live, next_phase(live.phase, secure=True),
                   f"unmasked the sum of {len(result.included)} masked release(s) ({why}); "
                   f"dropped: {', '.join(dropped) or 'none'}")

    # ---- FITTING -> DONE ----
    def submit_fit(self, round_id: str) -> None:
        if not self.ctx.closed:
            self._fit_pool.submit(self._fit, round_id)

    def _fit(self, round_id: str) -> None:
        ctx = self.ctx
        with ctx.lock:
            live = ctx.rounds[round_id]
            parts = sorted(live.contributions.items())
            running = live.running.copy()
            dropped, phases = live.dropped(), [list(p) for p in live.stored.phases]
        spec = live.spec
        try:
            result, total, fit_s = fit_round(
                spec, running, parts, round_s=live.stored.round_s, skip_fit=ctx.skip_fit,
                dropped=dropped, phases=phases)
        except Exception as exc:  # noqa: BLE001 - any fit error fails the round, visibly
            log.exception("round %s: fit failed", round_id)
            with ctx.lock:
                if not ctx.closed:
                    self.fail(live, f"fit failed: {type(exc).__name__}: {exc}")
            return
        with ctx.lock:
            if ctx.closed:
                return  # a restart re-fits; the store still says FITTING
            self.enter(live, next_phase(live.phase, secure=False), result=result, fit_s=fit_s)
        log.info("round %s: DONE, n_total=%d, fit %.2f s (%s)", round_id,
                 total.n_x if spec.targets else total.n, fit_s,
                 "skipped" if ctx.skip_fit else spec.fit_method or "auto")

    def shutdown(self) -> None:
        """No fit starts any more (one running is abandoned: the store still says FITTING)."""
        self._fit_pool.shutdown(wait=False, cancel_futures=True)


@dataclass(eq=False)
class Phase:
    """What each part that takes the sites' answers (consent, release, secure steps,
    refusals) holds: the shared context, and the transitions its answers may set off
    (``Transitions.close_if_due``, ``Transitions.fail``)."""
    ctx: RoundContext
    transitions: Transitions
