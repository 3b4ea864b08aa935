"""The sites' messages in a secure round's key and unmasking steps (SendPhase "advertise",
"share_keys", "confirm", "unmask"): checked, stored, then recorded in the round's secagg
session. The session itself, and what each step means, is aggregator.rounds.secure_session;
the masked releases of the release step are taken by aggregator.rounds.release; when a step
ends is decided by aggregator.rounds.transitions."""

from __future__ import annotations

import logging

from dpfed import secure_round
from dpfed.v1 import dpfed_pb2 as pb

from aggregator.errors import Rejected
from aggregator.rounds import secure_session
from aggregator.rounds.live import LiveRound
from aggregator.rounds.slots import check_slot
from aggregator.rounds.transitions import Phase

log = logging.getLogger(__name__)


class SecureSteps(Phase):
    def secure_phase(self, m: pb.PhaseMessage, envelope: pb.SignedEnvelope,
                     live: LiveRound) -> pb.Ack:
        """A signed PhaseMessage of step advertise, share_keys, confirm or unmask: checked
        (round, step, sender, freshness, nonce, the secagg core's checks), stored with its
        nonce (group commit, outside the lock), then counted; the step ends when it was the
        last."""
        ctx = self.ctx
        step, site, rid = m.phase, m.site_id, m.round_id
        with ctx.lock:
            msg = self._check(m, live)
            ctx.auth.take_nonce(envelope.key_id, m.nonce, m.timestamp_unix_ms, "PhaseMessage",
                                persist=False)
            ctx.auth.nonces.add((envelope.key_id, m.nonce))
            live.pending[site] = msg
        now = ctx.now_ms()
        try:
            ctx.store.insert_phase_message_later(
                rid, site, step, envelope.SerializeToString(), now, envelope.key_id, m.nonce,
                m.timestamp_unix_ms).result()
        except Exception as exc:  # noqa: BLE001 - not stored: free the slot, say so
            with ctx.lock:
                live.pending.pop(site, None)
                ctx.auth.nonces.discard((envelope.key_id, m.nonce))
                self.transitions.close_if_due(live)
            raise Rejected("UNAVAILABLE", f"the aggregator could not store the {step} message "
                                          f"({type(exc).__name__}: {exc}); retry") from None
        with ctx.lock:
            live.pending.pop(site, None)
            if live.step != step:   # the round failed meanwhile: stored, not counted
                return pb.Ack(message=f"{step} stored; round {rid!r} is {live.state}")
            live.session.record(msg)
            live.answers[site] = now
            log.debug("round %s: %s of %s recorded (%d of %d)", rid, step, site,
                      len(live.answers), len(live.expected()))
            self.transitions.close_if_due(live)
        return pb.Ack(message=f"{step} recorded")

    def _check(self, m: pb.PhaseMessage, live: LiveRound):
        """Under the lock: every check of a step message, cheapest first; returns the secagg
        message the session would accept (nothing recorded yet)."""
        step, site, rid = m.phase, m.site_id, m.round_id
        if live.secure is None and not secure_round.is_secure(live.spec):
            raise Rejected("FAILED_PRECONDITION", f"round {rid!r} is not a secure round: it "
                                                  f"takes no {step} message")
        if site not in live.invited:
            raise Rejected("PERMISSION_DENIED", f"site {site!r} is not invited to round "
                                                f"{rid!r}")
        if m.spec_digest != live.stored.spec_digest:
            raise Rejected("FAILED_PRECONDITION", "spec_digest does not match the round")
        if live.step != step:
            where = f"{live.state} ({live.step})" if live.step else live.state
            raise Rejected("FAILED_PRECONDITION", f"round {rid!r} is in {where}: a {step} "
                                                  f"message is out of phase")
        check_slot(live, site, answered=live.answers, storing=live.pending,
                   what=f"{step} message")
        self.ctx.auth.check_fresh(m.timestamp_unix_ms, "PhaseMessage")
        return secure_session.check_secagg(live, m.body, site,
                                           secure_session.PHASE_MESSAGE_TYPES[step])
