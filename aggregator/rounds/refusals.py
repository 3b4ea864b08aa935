"""A site's signed refusal (Refuse), in any phase that still takes answers: recorded, and the
round fails at once if its quorum became unreachable, or its phase ends if the refusal was
the last answer it waited for (aggregator.rounds.transitions)."""

from __future__ import annotations

import logging

from dpfed import secure_round
from dpfed.v1 import dpfed_pb2 as pb

from aggregator import identity
from aggregator.errors import Rejected
from aggregator.rounds.states import COLLECTING, CONSENT, KEYS
from aggregator.rounds.transitions import Phase

log = logging.getLogger(__name__)


class Refusals(Phase):
    def refuse(self, envelope: pb.SignedEnvelope,
               peer: identity.PeerIdentity | None = None) -> pb.Ack:
        ctx = self.ctx
        r = ctx.auth.verify_site(envelope, "dpfed.v1.Refusal", peer)
        live = ctx.round(r.round_id)
        with ctx.lock:
            if live.refusals.get(r.site_id) is not None:
                return pb.Ack(message="refusal already recorded")
            if r.site_id not in live.invited:
                raise Rejected("PERMISSION_DENIED", f"site {r.site_id!r} is not invited")
            if live.state not in COLLECTING:
                raise Rejected("FAILED_PRECONDITION", f"round {r.round_id!r} is closed "
                                                      f"({live.state})")
            if live.state != CONSENT and r.site_id not in live.participants:
                raise Rejected("FAILED_PRECONDITION", f"site {r.site_id!r} is not a participant "
                                                      f"of round {r.round_id!r}")
            if live.state in (CONSENT, KEYS) and r.epsilon_spent:
                raise Rejected("INVALID_ARGUMENT", "a refusal in the consent or key phase cannot "
                                                   "have spent epsilon: nothing is drawn before "
                                                   "the release phase")
            if secure_round.is_secure(live.spec) and r.epsilon_spent:
                raise Rejected("INVALID_ARGUMENT", "a refusal in a secure round cannot have "
                                                   "spent epsilon: a site debits only with its "
                                                   "masked release")
            if r.spec_digest != live.stored.spec_digest:
                raise Rejected("FAILED_PRECONDITION", "spec_digest does not match the round")
            if r.site_id in live.contributions or r.site_id in live.storing:
                raise Rejected("ALREADY_EXISTS", f"site {r.site_id!r} already contributed")
            ctx.auth.check_fresh(r.timestamp_unix_ms, "Refusal")
            if r.epsilon_spent and r.epsilon_spent != live.spec.epsilon:
                # A refusal that debited (noisy n below min_n, drawn first) spent the round's
                # epsilon, no other amount.
                raise Rejected("INVALID_ARGUMENT", f"refusal epsilon_spent {r.epsilon_spent} is "
                                                   f"neither 0 nor the round's epsilon "
                                                   f"{live.spec.epsilon}")
            ctx.auth.take_nonce(envelope.key_id, r.nonce, r.timestamp_unix_ms, "Refusal",
                                persist=False)
            now = ctx.now_ms()
            ctx.store.insert_refusal(r.round_id, r.site_id, r.reason,
                                     envelope.SerializeToString(), now, envelope.key_id,
                                     r.nonce, r.timestamp_unix_ms, epsilon=r.epsilon_spent)
            ctx.auth.nonces.add((envelope.key_id, r.nonce))
            live.refusals[r.site_id] = r.reason
            if r.epsilon_spent:
                # Recorded, not checked against the declared total: the site already spent it
                # (its ledger debited it), and hiding it would only under-count.
                live.refusal_epsilons[r.site_id] = r.epsilon_spent
                ctx.budgets.commit(r.site_id, r.epsilon_spent, now, reserved=False)
            log.info("round %s: site %s refused in %s: %s", r.round_id, r.site_id, live.state,
                     r.reason)
            pool = live.invited if live.state == CONSENT else live.participants
            floor = live.stored.quorum
            if secure_round.is_secure(live.spec):
                floor = secure_round.min_contributors(live.spec)
                if live.secure is not None and live.state != CONSENT:
                    pool, floor = live.expected() | set(live.contributions), live.secure.floor
            if len(pool - set(live.refusals)) < floor:
                self.transitions.fail(live, f"quorum {floor} is unreachable: refused by "
                                            f"{', '.join(sorted(live.refusals))}"
                                            + ("; no site released" if live.state == CONSENT
                                               else ""))
            else:
                self.transitions.close_if_due(live)
        return pb.Ack(message="refusal recorded")
