"""The consent phase: each invited site checks the signed spec, its policy, its budget and
its data and answers with a signed consent (SendPhase "consent") or a refusal
(aggregator.rounds.refusals). Nothing is drawn and nothing is debited, so a refusal here costs
nobody anything. The phase ends when every invited site answered or at the consent deadline
(aggregator.rounds.transitions: at least ``quorum`` consents, and those sites are the
participants; else FAILED)."""

from __future__ import annotations

import logging
from concurrent.futures import Future

from dpfed.v1 import dpfed_pb2 as pb

from aggregator.errors import Rejected
from aggregator.rounds.live import LiveRound
from aggregator.rounds.states import CONSENT
from aggregator.rounds.transitions import Phase

log = logging.getLogger(__name__)


class ConsentPhase(Phase):
    def consent_later(self, m: pb.PhaseMessage, envelope: pb.SignedEnvelope,
                      live: LiveRound) -> Future:
        """Phase "consent": the site will release if selected. Checked and its site's slot
        reserved now, under the lock (a refusal raises Rejected here); recorded durably (with
        its nonce) by the store's group commit; the returned future holds the Ack once
        durable (or the commit's error), and the consent is counted by the store's writer
        thread then, whether or not anyone waits. Does not block, so the event loop calls it
        directly (a thread hop per consent cost more than the checks: 1000 consents took
        0.48 s through the executor, docs/benchmarks.md). The consent phase ends early once
        every invited site answered.

        Many sites consent at once: one transaction for all that arrive together. The
        consent deadline does not end the phase while consents are being stored (it is
        carried out when the last one is durable), so a site answered "consent recorded" is
        always a participant."""
        ctx = self.ctx
        reply: Future = Future()
        with ctx.lock:
            if m.site_id in live.consents:
                reply.set_result(pb.Ack(message="consent already recorded"))
                return reply
            storing = live.consents_storing.get(m.site_id)
            if storing is None:
                done, received_ms = self._reserve(m, envelope, live)
        if storing is not None:
            # The same site's consent is being committed (a resend): its outcome answers.
            def echo(first: Future) -> None:
                if first.exception() is None:
                    reply.set_result(pb.Ack(message="consent already recorded"))
                else:
                    reply.set_exception(Rejected(
                        "UNAVAILABLE", f"the consent of site {m.site_id!r} could not be "
                                       f"recorded yet; retry"))
            storing.add_done_callback(echo)
            return reply
        try:
            stored = ctx.store.insert_consent_later(
                m.round_id, m.site_id, envelope.SerializeToString(), received_ms,
                envelope.key_id, m.nonce, m.timestamp_unix_ms)
        except BaseException as exc:
            self._abandon(m, envelope, live, done, exc)
            raise

        def settle(committed: Future) -> None:
            error = committed.exception()
            if error is not None:
                self._abandon(m, envelope, live, done, error)
                reply.set_exception(error)
                return
            with ctx.lock:
                del live.consents_storing[m.site_id]
                live.consents[m.site_id] = received_ms
                done.set_result(None)
                log.info("round %s: site %s consented (%d of %d invited)", m.round_id,
                         m.site_id, len(live.consents), len(live.invited))
                try:
                    self.transitions.close_if_due(live)
                finally:
                    reply.set_result(pb.Ack(message="consent recorded"))
        stored.add_done_callback(settle)
        return reply

    def _reserve(self, m: pb.PhaseMessage, envelope: pb.SignedEnvelope,
                 live: LiveRound) -> tuple[Future, int]:
        """Under the lock: every check of a consent, then its nonce and its site's slot
        reserved (a concurrent resend waits for its outcome). Returns the slot's future and
        the time of receipt (ms)."""
        auth = self.ctx.auth
        if m.site_id not in live.invited:
            raise Rejected("PERMISSION_DENIED", f"site {m.site_id!r} is not invited to round "
                                                f"{m.round_id!r}")
        if m.spec_digest != live.stored.spec_digest:
            raise Rejected("FAILED_PRECONDITION", "spec_digest does not match the round")
        if live.state != CONSENT:
            raise Rejected("FAILED_PRECONDITION",
                           f"round {m.round_id!r} is past its consent phase ({live.state}): "
                           f"site {m.site_id!r} is not a participant and must not release")
        if m.site_id in live.refusals:
            raise Rejected("ALREADY_EXISTS", f"site {m.site_id!r} refused round {m.round_id!r}")
        auth.check_fresh(m.timestamp_unix_ms, "PhaseMessage")
        auth.take_nonce(envelope.key_id, m.nonce, m.timestamp_unix_ms, "PhaseMessage",
                        persist=False)
        auth.nonces.add((envelope.key_id, m.nonce))
        done: Future = Future()
        live.consents_storing[m.site_id] = done
        return done, self.ctx.now_ms()

    def _abandon(self, m: pb.PhaseMessage, envelope: pb.SignedEnvelope, live: LiveRound,
                 done: Future, error: BaseException) -> None:
        """The consent's commit failed: free its slot and nonce, tell a waiting resend."""
        with self.ctx.lock:
            del live.consents_storing[m.site_id]
            self.ctx.auth.nonces.discard((envelope.key_id, m.nonce))
            done.set_exception(error)
            self.transitions.close_if_due(live)
