"""RoundManager: the aggregator's rounds as plain synchronous methods, which the gRPC
servicer (aggregator.service) adapts one to one. A thin facade: each method is one phase's
(aggregator.rounds, the package docstring, says which is where), and they share one
RoundContext."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future

from dpfed import noise as dpnoise
from dpfed.statistics import Statistics
from dpfed.v1 import dpfed_pb2 as pb

from aggregator import identity
from aggregator.registry import Registry
from aggregator.rounds import recovery, start
from aggregator.rounds.consent import ConsentPhase
from aggregator.rounds.context import RoundContext
from aggregator.rounds.live import Admission, LiveRound
from aggregator.rounds.reads import RoundReads
from aggregator.rounds.refusals import Refusals
from aggregator.rounds.release import ReleasePhase
from aggregator.rounds.secure_steps import SecureSteps
from aggregator.rounds.transitions import Transitions
from aggregator.store import RoundStore

log = logging.getLogger(__name__)


class RoundManager:
    def __init__(self, store: RoundStore, registry: Registry, *, max_clock_skew_s: float = 300.0,
                 skip_fit: bool = False, clock=time.time, signing_key=None):
        ctx = self.context = RoundContext(store, registry, max_clock_skew_s=max_clock_skew_s,
                                          skip_fit=skip_fit, clock=clock,
                                          signing_key=signing_key)
        # What callers reach through the manager (the same objects as the context's).
        self.store, self.registry, self.auth = ctx.store, ctx.registry, ctx.auth
        self.budgets, self.subscribers = ctx.budgets, ctx.subscribers
        # The state machine, and the phases that take the sites' answers.
        self.transitions = Transitions(ctx)
        self.consent = ConsentPhase(ctx, self.transitions)
        self.release = ReleasePhase(ctx, self.transitions)
        self.secure = SecureSteps(ctx, self.transitions)
        self.refusals = Refusals(ctx, self.transitions)
        self.reads = RoundReads(ctx)

    def now_ms(self) -> int:
        return self.context.now_ms()

    # ---- start-up and shutdown ----
    def recover(self) -> None:
        """Reload every round from the store (aggregator.rounds.recovery)."""
        recovery.recover(self.context, self.transitions)

    def close(self) -> None:
        ctx = self.context
        with ctx.lock:
            ctx.closed = True
            for live in ctx.rounds.values():
                if live.timer:
                    live.timer.cancel()
        ctx.subscribers.close()
        self.transitions.shutdown()

    # ---- coordinator side ----
    def start_round(self, envelope: pb.SignedEnvelope,
                    peer: identity.PeerIdentity | None = None) -> pb.RoundStatus:
        return self.status(start.start_round(self.context, self.transitions, envelope, peer))

    def status(self, round_id: str, peer: identity.PeerIdentity | None = None) -> pb.RoundStatus:
        return self.reads.status(round_id, peer)

    def result(self, round_id: str, peer: identity.PeerIdentity | None = None) -> pb.RoundResult:
        return self.reads.result(round_id, peer)

    def list_sites(self, peer: identity.PeerIdentity | None = None) -> pb.ListSitesReply:
        return self.reads.list_sites(peer)

    def site_spending(self, site_id: str,
                      peer: identity.PeerIdentity | None = None) -> pb.SiteSpending:
        return self.reads.site_spending(site_id, peer)

    def list_rounds(self, limit: int = 0, before: str = "") -> pb.ListRoundsReply:
        return self.reads.list_rounds(limit, before)

    def aggregated_statistics(self, round_id: str) -> Statistics:
        return self.reads.aggregated_statistics(round_id)

    def expected_noise(self, round_id: str) -> dpnoise.NoiseDescription:
        return self.release.expected_noise(round_id)

    # ---- a site's round stream ----
    def hello(self, envelope: pb.SignedEnvelope, peer: identity.PeerIdentity | None = None,
              *, declare: bool = True) -> str:
        """Authenticate a SiteHello; returns the site id. ``declare``: record the total budget
        and trusted coordinators it declares (Subscribe; not GetSiteHistory)."""
        auth = self.context.auth
        hello = auth.verify_site(envelope, "dpfed.v1.SiteHello", peer)
        auth.check_fresh(hello.timestamp_unix_ms, "SiteHello")
        auth.take_nonce(envelope.key_id, hello.nonce, hello.timestamp_unix_ms, "SiteHello")
        if declare:
            self.context.budgets.declare(hello, envelope, self.now_ms())
        return hello.site_id

    def site_history(self, envelope: pb.SignedEnvelope,
                     peer: identity.PeerIdentity | None = None) -> pb.SiteHistory:
        """The aggregator's record of the spending of the site whose signed SiteHello this is
        (GetSiteHistory): only that site may ask, over its own TLS identity."""
        return self.context.budgets.history(self.hello(envelope, peer, declare=False))

    def subscribe(self, site_id: str, updates=None) -> tuple[int, object]:
        """Register a round stream of ``site_id`` (aggregator.subscribers: one live stream per
        identity); its queue gets the id of every round that needs the site."""
        token, q = self.context.subscribers.add(site_id, updates)
        self.context.registry.mark_connected(site_id, self.now_ms())
        log.info("site %s subscribed", site_id)
        return token, q

    def unsubscribe(self, token: int) -> None:
        site_id = self.context.subscribers.remove(token)
        if site_id:
            self.context.registry.mark_disconnected(site_id, self.now_ms())
            log.info("site %s unsubscribed", site_id)

    def message_for_site(self, round_id: str, site_id: str) -> pb.SignedEnvelope | None:
        return self.reads.message_for_site(round_id, site_id)

    def pending_rounds(self, site_id: str) -> list[str]:
        return self.reads.pending_rounds(site_id)

    # ---- a site's answers ----
    def send_phase(self, envelope: pb.SignedEnvelope,
                   peer: identity.PeerIdentity | None = None) -> pb.Ack:
        """A site's signed PhaseMessage, answered once handled (blocking): a consent
        (``consent_later``) once durable, a secure step's message (``secure_phase``)."""
        m, live = self.phase_message(envelope, peer)
        if m.phase != "consent":
            return self.secure_phase(m, envelope, live)
        return self.consent_later(m, envelope, live).result()

    def phase_message(self, envelope: pb.SignedEnvelope,
                      peer: identity.PeerIdentity | None = None
                      ) -> tuple[pb.PhaseMessage, LiveRound]:
        """The verified PhaseMessage of ``envelope`` and its live round (Rejected if the
        signature, the key's owner or the round is wrong). Does not block."""
        m = self.context.auth.verify_site(envelope, "dpfed.v1.PhaseMessage", peer)
        return m, self.context.round(m.round_id)

    def consent_later(self, m: pb.PhaseMessage, envelope: pb.SignedEnvelope,
                      live: LiveRound) -> Future:
        return self.consent.consent_later(m, envelope, live)

    def secure_phase(self, m: pb.PhaseMessage, envelope: pb.SignedEnvelope,
                     live: LiveRound) -> pb.Ack:
        return self.secure.secure_phase(m, envelope, live)

    def contribute(self, envelope: pb.SignedEnvelope,
                   peer: identity.PeerIdentity | None = None) -> pb.ContributeReply:
        return self.release.contribute(envelope, peer)

    def contribute_later(self, envelope: pb.SignedEnvelope,
                         peer: identity.PeerIdentity | None = None) -> Future:
        return self.release.contribute_later(envelope, peer)

    def admit_contribution(self, envelope: pb.SignedEnvelope,
                           peer: identity.PeerIdentity | None = None) -> Admission:
        return self.release.admit_contribution(envelope, peer)

    def complete_contribution(self, admission: Admission) -> pb.ContributeReply:
        return self.release.complete_contribution(admission)

    def abandon_contribution(self, admission: Admission) -> None:
        self.release.abandon_contribution(admission)

    def refuse(self, envelope: pb.SignedEnvelope,
               peer: identity.PeerIdentity | None = None) -> pb.Ack:
        return self.refusals.refuse(envelope, peer)
