"""StartRound: a coordinator's signed spec checked (signature, owner, limits, the spec itself,
its deadlines, its noise; for a secure round the aggregator's signing key and the sites' key
ids), then the round stored in CONSENT, the invited sites woken and the consent deadline
armed."""

from __future__ import annotations

import logging

from dpfed import secure_round
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire import limits
from dpfed.wire.canonical import CanonicalError, digest
from dpfed.wire.signing import SignatureError, verify

from aggregator import aggregate, identity
from aggregator.contribution_wire import check_envelope_size
from aggregator.errors import Rejected
from aggregator.rounds import secure_session
from aggregator.rounds.context import RoundContext
from aggregator.rounds.contributions import round_expected_noise
from aggregator.rounds.deadlines import consent_deadline_ms
from aggregator.rounds.live import LiveRound
from aggregator.rounds.states import CONSENT
from aggregator.rounds.transitions import Transitions
from aggregator.store import StoredRound

log = logging.getLogger(__name__)


def start_round(ctx: RoundContext, transitions: Transitions, envelope: pb.SignedEnvelope,
                peer: identity.PeerIdentity | None = None) -> str:
    """Check and store the round of ``envelope``; returns its id (Rejected if refused)."""
    check_envelope_size(envelope)
    try:
        spec = verify(envelope, ctx.registry.coordinator_keys, "dpfed.v1.RoundSpec")
    except SignatureError as exc:
        raise Rejected("UNAUTHENTICATED", str(exc)) from None
    except CanonicalError as exc:
        raise Rejected("INVALID_ARGUMENT", str(exc)) from None
    owner = ctx.registry.coordinator_of_key(envelope.key_id)
    if spec.coordinator_id != owner:
        raise Rejected("PERMISSION_DENIED", f"spec names coordinator {spec.coordinator_id!r} "
                                            f"but is signed by the key of {owner!r}")
    mismatch = identity.coordinator_mismatch(peer, spec.coordinator_id)
    if mismatch:
        raise Rejected("PERMISSION_DENIED", mismatch)
    problems = limits.spec_problems(spec)
    if not problems:  # validate_spec decodes public statistics: only once they fit
        problems = aggregate.validate_spec(spec, ctx.registry.site_ids())
    now = ctx.now_ms()
    if spec.deadline_unix_ms and spec.deadline_unix_ms <= now:
        problems.append("deadline_unix_ms is in the past")
    if spec.consent_deadline_unix_ms and spec.consent_deadline_unix_ms <= now:
        problems.append("consent_deadline_unix_ms is in the past")
    if not problems:
        try:  # what every contribution must declare; also refuses degenerate scales
            expected = round_expected_noise(spec)
        except ValueError as exc:
            problems.append(str(exc))
    invited = sorted(spec.sites) if spec.sites else ctx.registry.site_ids()
    secure = secure_round.is_secure(spec)
    if secure:
        unsigned = secure_session.signing_problem(ctx, spec)
        if unsigned and ctx.signing_key is None:
            raise Rejected("FAILED_PRECONDITION", f"round {spec.round_id!r} refused: "
                                                  f"{unsigned}")
        if unsigned:
            problems.append(unsigned)
    if not problems and secure and spec.site_key_ids:
        problems += _site_key_problems(ctx, spec, invited)
    if problems:
        raise Rejected("INVALID_ARGUMENT", "invalid round spec: " + "; ".join(problems))
    stored = StoredRound(spec.round_id, envelope.SerializeToString(), digest(envelope.payload),
                         len(spec.feature_names), spec.quorum, spec.deadline_unix_ms, invited,
                         CONSENT, "", now, 0.0, 0.0, None, [[CONSENT, now, 0.0]])
    with ctx.lock:
        if spec.round_id in ctx.rounds:
            raise Rejected("ALREADY_EXISTS", f"round {spec.round_id!r} already exists")
        ctx.store.insert_round(stored)
        ctx.rounds[spec.round_id] = LiveRound(
            stored, spec, envelope, frozenset(invited),
            running=None if secure else aggregate.running_total(spec),
            expected_noise=expected)
        ctx.notify(invited, spec.round_id)
    log.info("round %s: started by %s, d=%d, eps=%g, %s, quorum %d of %d invited site(s), "
             "consent within %.0f s, deadline in %.0f s", spec.round_id, owner,
             len(spec.feature_names), spec.epsilon, secure_round.describe(spec),
             spec.quorum, len(invited),
             (consent_deadline_ms(spec, now) - now) / 1000, (spec.deadline_unix_ms - now) / 1000)
    transitions.arm(spec.round_id)
    if spec.targets and not ctx.skip_fit:   # a joint round: its fit's workers start now
        from aggregator.joint_fit import prestart
        prestart(len(spec.targets))
    return spec.round_id


def _site_key_problems(ctx: RoundContext, spec: pb.RoundSpec, invited: list[str]) -> list[str]:
    """The coordinator's anchor of the identity keys relayed to the sites (site_key_ids) must
    name the keys this aggregator has registered."""
    problems = []
    for site in invited:
        kid = spec.site_key_ids.get(site)
        record = ctx.registry.sites.get(site)
        if kid is None:
            problems.append(f"site_key_ids names no key for invited site {site}")
        elif record is not None and kid != record.key_id:
            problems.append(f"site_key_ids names key {kid} for site {site}, which is "
                            f"registered with key {record.key_id}")
    return problems
