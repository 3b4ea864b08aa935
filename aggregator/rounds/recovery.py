"""After a restart: every round reloaded from the store as it was last written (each state
change is durable before it is made in memory), the deadline timers of open rounds armed
again, the secure sessions rebuilt by replay, and interrupted fits run again."""

from __future__ import annotations

import logging

import numpy as np

from dpfed import secure_round
from dpfed.statistics import encoded_values
from dpfed.wire.canonical import parse_canonical

from aggregator import aggregate
from aggregator.contribution_wire import parse_envelope
from aggregator.rounds import secure_session
from aggregator.rounds.context import RoundContext
from aggregator.rounds.contributions import AcceptedContribution, noise_of, stored_contribution
from aggregator.rounds.live import LiveRound
from aggregator.rounds.states import COLLECTING, FITTING, OPEN, RELEASE, SECURE_STATES
from aggregator.rounds.transitions import Transitions
from aggregator.store import RoundStore

log = logging.getLogger(__name__)


def load_contributions(store: RoundStore, live: LiveRound):
    """The stored contributions of ``live`` into ``live.contributions``; returns them."""
    stored_contributions = store.contributions(live.stored.round_id)
    for c in stored_contributions:
        env = parse_envelope(c.envelope)
        msg = stored_contribution(env.payload)
        live.contributions[c.site_id] = AcceptedContribution(
            env.payload, env.signature, c.statistics, c.n, c.epsilon, c.received_ms,
            noise_of(msg), masked=msg.masked)
    return stored_contributions


def recover(ctx: RoundContext, transitions: Transitions) -> None:
    """Reload every round from the store; restart deadline timers of open rounds and re-fit
    rounds whose fit was interrupted."""
    ctx.auth.load()
    refit, reopen = [], []
    counts = ctx.store.contribution_counts()
    with ctx.lock:
        for stored in ctx.store.rounds():
            env = parse_envelope(stored.spec_envelope)
            spec = parse_canonical(env.payload, "dpfed.v1.RoundSpec")
            if stored.state == OPEN:   # stored before phases: every invited site releases
                stored.state, stored.participants = RELEASE, list(stored.invited)
            live = LiveRound(stored, spec, env, frozenset(stored.invited))
            live.consents = ctx.store.consents(stored.round_id)
            if stored.participants is not None:
                live.participants = frozenset(stored.participants)
            secure = secure_round.is_secure(spec)
            if stored.state in (*COLLECTING, FITTING):
                contributions = load_contributions(ctx.store, live)
                if not secure:   # a secure round's sum is the unmasked one (replay)
                    live.running = aggregate.running_total(spec)
                if contributions and not secure and spec.targets:   # a joint round
                    for c in contributions:
                        live.running.add_encoded(c.statistics)
                    live.running.fold(1)
                elif contributions and not secure:
                    live.running.add_rows(
                        np.stack([encoded_values(c.statistics) for c in contributions]),
                        sum(c.n for c in contributions))
            else:   # DONE or FAILED: read from the store when asked (status)
                live.archived = counts.get(stored.round_id, 0)
            live.refusals = dict(ctx.store.refusals(stored.round_id))
            live.refusal_epsilons = ctx.store.refusal_epsilons(stored.round_id)
            if secure and stored.state in (*SECURE_STATES, FITTING):
                _rebuild_session(ctx, transitions, live)
            ctx.rounds[stored.round_id] = live
            if stored.state in COLLECTING:
                reopen.append(stored.round_id)
            elif stored.state == FITTING:
                refit.append(stored.round_id)
    for rid in reopen:
        live = ctx.rounds[rid]
        log.info("round %s: reopened after restart in %s with %d consent(s), %d "
                 "contribution(s)", rid, live.state, len(live.consents),
                 len(live.contributions))
        transitions.arm(rid)
    for rid in refit:
        log.info("round %s: fit was interrupted by a restart, fitting again", rid)
        transitions.submit_fit(rid)


def _rebuild_session(ctx: RoundContext, transitions: Transitions, live: LiveRound) -> None:
    """Under the lock: rebuild an open secure round's session (a round that cannot be rebuilt
    fails, saying why)."""
    try:
        secure_session.replay(ctx, live, finish=live.stored.state == FITTING)
    except Exception as exc:  # noqa: BLE001 - a round that cannot be rebuilt fails visibly
        log.exception("round %s: secure-aggregation state not rebuilt", live.stored.round_id)
        transitions.fail(live, f"the secure-aggregation state could not be rebuilt after a "
                               f"restart: {type(exc).__name__}: {exc}")
        return
    log.info("round %s: secure-aggregation state rebuilt after restart (%s, %d answer(s) "
             "in this step, %d masked release(s))", live.stored.round_id,
             live.stored.secure_step, len(live.answers), len(live.contributions))
