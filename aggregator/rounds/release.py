"""The release phase: a notice is pushed to each participant, which releases (draws the noise,
debits and stores the release in one ledger transaction) and sends it (Contribute). Only
participants may contribute, and every participant's release is taken: none is turned away
because others were faster. The phase ends when every participant answered, or at the
deadline (then a participant that never answered is listed as dropped): see
aggregator.rounds.transitions.

A secure round's releases are masked inputs (step "release"): checked by the secagg session,
never decoded as statistics here. Either kind is admitted (every check, its site's slot and
nonce reserved) on the caller's thread, stored by the store's group commit with the others
arriving together (outside the lock), then completed (counted, summed) or abandoned.
"""

from __future__ import annotations

import logging
import math
from concurrent.futures import Future

from dpfed import noise as dpnoise
from dpfed import secure_round
from dpfed.secagg.messages import MaskedInput
from dpfed.statistics import StatisticsError
from dpfed.v1 import dpfed_pb2 as pb

from aggregator import aggregate, identity, joint_round
from aggregator.errors import Rejected
from aggregator.rounds import secure_session
from aggregator.rounds.contributions import (AcceptedContribution, declared_noise,
                                             round_expected_noise)
from aggregator.rounds.live import Admission, LiveRound
from aggregator.rounds.slots import check_slot
from aggregator.rounds.states import CONSENT, KEYS, RELEASE
from aggregator.rounds.transitions import Phase

log = logging.getLogger(__name__)


def _resent(previous: AcceptedContribution, c: pb.Contribution, envelope: pb.SignedEnvelope,
            masked: bool) -> bool:
    """Whether ``c`` is the release already accepted from its site: the same bytes, or the
    site's re-signing of it with a fresh timestamp and nonce over the same stored statistics
    (or masked input) (site_node.node.fresh_envelope): the same noise, so nothing new."""
    if masked:
        return bool(c.masked) and (previous.payload == envelope.payload or (
            previous.masked == c.masked and previous.epsilon == c.epsilon_spent))
    return previous.payload == envelope.payload or (
        previous.statistics == c.statistics and previous.n == c.n
        and previous.epsilon == c.epsilon_spent)


class ReleasePhase(Phase):
    def contribute(self, envelope: pb.SignedEnvelope,
                   peer: identity.PeerIdentity | None = None) -> pb.ContributeReply:
        """``contribute_later`` and wait for the reply."""
        return self.contribute_later(envelope, peer).result()

    def contribute_later(self, envelope: pb.SignedEnvelope,
                         peer: identity.PeerIdentity | None = None) -> Future:
        """Check one signed contribution now (``admit_contribution``; a refusal raises
        Rejected here), queue it for the store's group commit, and return a future of the
        reply: once it is durable it is counted (``complete_contribution``, run by the
        store's writer), or, if the commit failed, its slot is freed and the future holds the
        error. What happens to the round does not depend on anyone waiting for the future."""
        admission = self.admit_contribution(envelope, peer)
        reply: Future = Future()
        if admission.reply is not None:
            reply.set_result(admission.reply)
            return reply
        try:
            stored = self.ctx.store.insert_contribution_later(*admission.row())
        except BaseException:
            self.abandon_contribution(admission)
            raise

        def settle(done: Future) -> None:
            try:
                if done.exception() is not None:
                    self.abandon_contribution(admission)
                    reply.set_exception(done.exception())
                else:
                    reply.set_result(self.complete_contribution(admission))
            except BaseException as exc:  # noqa: BLE001 - the waiter must hear of it
                log.exception("round %s: contribution of %s could not be counted",
                              admission.contribution.round_id, admission.contribution.site_id)
                if not reply.done():
                    reply.set_exception(exc)
        stored.add_done_callback(settle)
        return reply

    def admit_contribution(self, envelope: pb.SignedEnvelope,
                           peer: identity.PeerIdentity | None = None) -> Admission:
        """Every check of a contribution; then its site's slot in the round and its nonce are
        reserved (it counts towards the quorum, a retry is told to wait) until it is stored
        and completed, or abandoned. An identical retry of a stored contribution comes back
        with its ``reply`` set and nothing reserved: idempotent, it adds nothing."""
        ctx = self.ctx
        c = ctx.auth.verify_site(envelope, "dpfed.v1.Contribution", peer)
        live = ctx.round(c.round_id)
        site = c.site_id
        masked = bool(c.masked) or secure_round.is_secure(live.spec)
        with ctx.lock:
            previous = live.contributions.get(site)
        if previous is not None and _resent(previous, c, envelope, masked):
            return Admission(live, c, envelope, previous, reply=pb.ContributeReply(
                round_id=c.round_id, accepted=True, duplicate=True,
                message="identical contribution already accepted"))
        if masked and not secure_round.is_secure(live.spec):
            raise Rejected("INVALID_ARGUMENT", f"round {c.round_id!r} is not a secure round: "
                                               f"it takes no masked release")
        self._check_release(c, live)
        if masked:
            self._check_masked_values(c)
        else:
            self._check_statistics(c, live)
        if not (math.isfinite(c.epsilon_spent) and c.epsilon_spent == live.spec.epsilon):
            raise Rejected("INVALID_ARGUMENT", f"epsilon_spent {c.epsilon_spent} differs from the "
                                               f"round's epsilon {live.spec.epsilon}")
        noise = self._check_noise(c, live, masked)
        accepted = AcceptedContribution(envelope.payload, envelope.signature,
                                        b"" if masked else c.statistics, 0 if masked else c.n,
                                        c.epsilon_spent, ctx.now_ms(), noise, masked=c.masked)
        with ctx.lock:
            # Re-check under the lock: the round may have closed, or this site answered, while
            # the statistics were decoded. Then reserve the site's slot and the nonce.
            self._check_release(c, live)
            secagg = (secure_session.check_secagg(live, c.masked, site, MaskedInput)
                      if masked else None)
            ctx.auth.take_nonce(envelope.key_id, c.nonce, c.timestamp_unix_ms, "Contribution",
                                persist=False)
            # The site's recorded spend must stay within the total it declared.
            beyond = ctx.budgets.reserve(site, c.epsilon_spent, c.round_id)
            if beyond:
                raise Rejected("FAILED_PRECONDITION", beyond)
            live.storing[site] = accepted
            ctx.auth.nonces.add((envelope.key_id, c.nonce))
        # Durable before anything in memory changes or the site is answered; committed
        # together with the contributions arriving at the same time (RoundStore group
        # commit), without holding the lock so they can join the same transaction.
        return Admission(live, c, envelope, accepted, secagg=secagg)

    def abandon_contribution(self, admission: Admission) -> None:
        """The admitted contribution was not stored: free its slot and nonce."""
        live, c = admission.live, admission.contribution
        with self.ctx.lock:
            del live.storing[c.site_id]
            self.ctx.auth.nonces.discard((admission.envelope.key_id, c.nonce))
            self.ctx.budgets.release(c.site_id, c.epsilon_spent)
            self.transitions.close_if_due(live)

    def complete_contribution(self, admission: Admission) -> pb.ContributeReply:
        """The admitted contribution is durable: count it, add it to the running sum, and
        close the round if that reached the quorum (or a deadline passed meanwhile)."""
        live, c, accepted = admission.live, admission.contribution, admission.accepted
        with self.ctx.lock:
            del live.storing[c.site_id]
            live.contributions[c.site_id] = accepted
            self.ctx.budgets.commit(c.site_id, c.epsilon_spent, accepted.received_ms)
            if admission.secagg is not None:   # secure: the masked input joins the session
                if live.state == RELEASE:
                    live.session.record(admission.secagg)
            else:
                live.running.add_encoded(c.statistics)
            self.ctx.registry.touch(c.site_id, accepted.received_ms)
            count = len(live.contributions)
            log.debug("round %s: accepted contribution of %s (n=%d), %d of %d participant(s)",
                      c.round_id, c.site_id, c.n, count, len(live.participants))
            self.transitions.close_if_due(live)
        # The exact-sum arithmetic of a full block, outside the lock (RunningTotal.fold).
        if admission.secagg is None:
            live.running.fold()
        return pb.ContributeReply(round_id=c.round_id, accepted=True, duplicate=False,
                                  message=f"accepted ({count} of {len(live.participants)} "
                                          f"participant(s), quorum {live.stored.quorum})")

    def expected_noise(self, round_id: str) -> dpnoise.NoiseDescription:
        """The noise description every contribution to ``round_id`` must declare."""
        with self.ctx.lock:
            live = self.ctx.round(round_id)
        if live.expected_noise is None:
            live.expected_noise = round_expected_noise(live.spec)
        return live.expected_noise

    # ---- checks ----
    def _check_release(self, c: pb.Contribution, live: LiveRound) -> None:
        """Whether ``c``'s site may release into ``live`` now (its phase, its site's slot);
        cheapest first, freshness last."""
        rid, site = c.round_id, c.site_id
        if site not in live.invited:
            raise Rejected("PERMISSION_DENIED", f"site {site!r} is not invited to round {rid!r}")
        if live.state in (CONSENT, KEYS):
            what = "consent" if live.state == CONSENT else "key agreement"
            raise Rejected("FAILED_PRECONDITION", f"round {rid!r} is in its {what} phase: no "
                                                  f"release is taken before it ends")
        if live.state != RELEASE:
            raise Rejected("FAILED_PRECONDITION", f"round {rid!r} is closed ({live.state})")
        if site not in live.participants:
            raise Rejected("FAILED_PRECONDITION", f"site {site!r} is not a participant of round "
                                                  f"{rid!r} (it did not consent in time)")
        if c.spec_digest != live.stored.spec_digest:
            raise Rejected("FAILED_PRECONDITION", f"spec_digest {c.spec_digest[:16]} does not "
                                                  f"match round {rid!r} "
                                                  f"({live.stored.spec_digest[:16]})")
        # Not refused, no release taken (an identical one was answered as a duplicate before
        # this) or being stored (retryable: once stored, a retry of the same release is
        # answered as a duplicate), and in a secure round one of the sites that completed key
        # agreement.
        check_slot(live, site, answered=live.contributions, storing=live.storing,
                   what="release")
        self.ctx.auth.check_fresh(c.timestamp_unix_ms, "Contribution")

    @staticmethod
    def _check_statistics(c: pb.Contribution, live: LiveRound) -> None:
        """An independent release: statistics of the round's dimension, and their n (a joint
        round's: a JointStatistics of its features and targets, n = its n_x)."""
        if joint_round.is_joint(live.spec):
            try:
                stats = joint_round.decode_release(c.statistics, live.stored.dim,
                                                   len(live.spec.targets))
            except ValueError as exc:
                raise Rejected("INVALID_ARGUMENT", f"invalid statistics: {exc}") from None
            if c.n != stats.n_x:
                raise Rejected("INVALID_ARGUMENT", f"n = {c.n} differs from the joint "
                                                   f"statistics' n_x = {stats.n_x}")
            return
        try:
            stats_n = aggregate.encoded_n(c.statistics, live.stored.dim)
        except StatisticsError as exc:
            raise Rejected("INVALID_ARGUMENT", f"invalid statistics: {exc}") from None
        if stats_n != c.n:
            raise Rejected("INVALID_ARGUMENT", f"n = {c.n} differs from the statistics' n = "
                                               f"{stats_n}")
        if c.n < 1:
            raise Rejected("INVALID_ARGUMENT", "n must be at least 1")

    @staticmethod
    def _check_masked_values(c: pb.Contribution) -> None:
        """A secure round's release: a masked input only (the secagg session checks it under
        the lock), never statistics."""
        if not c.masked or c.statistics or c.n:
            raise Rejected("INVALID_ARGUMENT", f"round {c.round_id!r} is a secure round: a "
                                               f"contribution carries its masked input in "
                                               f"`masked`, with empty statistics and n = 0")

    @staticmethod
    def _check_noise(c: pb.Contribution, live: LiveRound,
                     masked: bool) -> dpnoise.NoiseDescription:
        """The contribution's declared noise, if it is exactly what the round's spec implies
        (law, scale, draws and grid of every part; for a masked input, its share of the one
        draw); else Rejected. A missing description is a disagreement: statistics of unknown
        noise are never summed as if known."""
        if masked:
            expected = live.secure.share_noise()
        else:
            expected = live.expected_noise
            if expected is None:
                expected = live.expected_noise = round_expected_noise(live.spec)
        declared = declared_noise(c, expected)
        if declared == expected:
            return declared
        if masked:
            raise Rejected("INVALID_ARGUMENT",
                           f"noise description ({declared.summary()}) differs from the share "
                           f"of round {c.round_id!r} ({expected.summary()})")
        raise Rejected("INVALID_ARGUMENT",
                       f"noise description ({declared.summary()}) differs from what round "
                       f"{c.round_id!r} specifies ({expected.summary()}): wrong mechanism, "
                       f"relation, split or bounds")
