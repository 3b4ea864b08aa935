"""A site's side of secure rounds (docs/protocol.md, "Secure rounds"; dpfed.secure_round).

After consent (``SiteNode.consent``, as for any round) the aggregator pushes one
``PhaseNotice`` per step, each carrying the coordinator-signed spec (verified again here)
and what the step needs in ``body``:

    "keys"        participants + the identity keys of the participants and the aggregator
                  -> build the RoundConfig, SiteSession.advertise()   -> SendPhase("advertise")
    "share_keys"  AdvertisementBundle -> SiteSession.share_keys()   -> SendPhase("share_keys")
    "release"     ShareDelivery -> fixed-point statistics + this site's 1/T noise share
                  (GridCalibration.release), SiteSession.masked_input(); then, in ONE ledger
                  transaction, debit the round's epsilon and store the signed masked
                  Contribution; only then is it sent (Contribute)
    "confirm"     SurvivorList -> SiteSession.confirm(): sign the one survivor set
                                                                      -> SendPhase("confirm")
    "unmask"      UnmaskRequest -> SiteSession.unmask()              -> SendPhase("unmask")

The session's secrets (X25519 keys, self-mask seed, received shares) live in memory only. A
site that restarts before its release has lost them: it ignores the later notices of that
round and drops out, with nothing drawn that left it and nothing debited. After its release
the stored masked Contribution is resent (re-signed when old, same bytes: ``SiteNode.
fresh_envelope``), and its unmask answer may be missing: the other holders' shares cover it
(docs/protocol.md). A notice of a step already answered (the aggregator restarted before
storing the answer) gets the same answer body again under a fresh nonce.

What this site checks on its own, whatever the aggregator says: the spec's signature and the
site policy (``policy.max_noise_threshold``: the largest T it accepts), that it is a
participant and the participants make a feasible round, that every relayed identity key
matches the key id the coordinator signed into the spec (``site_key_ids``, when given), that
the aggregator's relayed key matches ``aggregator_key_id`` (a secure spec without it is
refused) and then that every later notice body carries that key's valid signature
(``SiteSession(aggregator_key=...)``), and everything the secagg core checks (signed adverts,
authenticated shares, at least t holders, never revealing both secrets of a site, at least
max(T + c, quorum) contributions).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from dpfed import secure_round
from dpfed.noise import to_proto as noise_to_proto
from dpfed.preprocess import NonFiniteRow
from dpfed.secagg.errors import SecAggError
from dpfed.secagg.exact import (JointExactStatistics, joint_exact_statistics, quantize,
                                quantum_exponents)
from dpfed.secagg.messages import AGGREGATOR
from dpfed.secagg.protocol import SiteSession
from dpfed.sensitivity import row_norm_bound
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.canonical import digest
from dpfed.wire.signing import key_id
from site_node import policy as site_policy
from site_node.data import DataError
from site_node.ledger import BudgetExhausted, RoundConflict
from site_node.messages import RELEASE_FAILED, new_nonce, now_ms
from site_node.release import clip, exact_clipped_statistics, project_rows
from site_node.rows import finite_after_preprocessing, log_left_out

log = logging.getLogger(__name__)

# Notice phase -> the PhaseMessage phase this site answers with.
ANSWER_PHASE = {"keys": "advertise", "share_keys": "share_keys", "confirm": "confirm",
                "unmask": "unmask"}
NOTICE_PHASES = ("keys", "share_keys", "release", "confirm", "unmask")
# Fixed reasons of a "keys" notice refused for the aggregator's key (sent before this site
# advertised anything).
NO_AGGREGATOR_PIN = ("the spec pins no aggregator key (aggregator_key_id): this site cannot "
                     "check the aggregator's signatures on the secure-aggregation messages")
NO_AGGREGATOR_KEY = "the key notice relays no aggregator key"
WRONG_AGGREGATOR_KEY = ("the key notice relays another aggregator key than the one the "
                        "coordinator signed (aggregator_key_id)")
# Steps after this site's masked release: a refusal message would be refused (the site is
# accounted as released); it says why in its own log and answers nothing.
AFTER_RELEASE = ("confirm", "unmask")


@dataclass
class _SecureState:
    spec: pb.RoundSpec
    spec_digest: str
    secure: secure_round.SecureRound
    session: SiteSession
    # The coordinator-signed spec as verified at the "keys" notice: later notices name only
    # its digest.
    spec_envelope: pb.SignedEnvelope | None = None
    # Notice phase -> the body this site answered with (resent on a repeated notice).
    answered: dict[str, bytes] = field(default_factory=dict)


class SecureSite:
    """The secure rounds of one SiteNode (which holds the lock, keys, ledger and config).

    The node composes it (``SiteNode.secure``) and hands itself in; this module never imports
    site_node.node. Of the node it uses ``site_id``, ``config``, ``signing_key``, ``ledger``,
    ``refusal`` and ``fresh_envelope``."""

    def __init__(self, node):
        self.node = node
        self._rounds: dict[str, _SecureState] = {}
        # TEST HOOK: called as on_release(round_id, encoded, x) with this site's fixed-point
        # statistics without noise and its input (statistics + noise share) just before they
        # are masked; lets tests check the unmasked sum exactly. None in production: neither
        # vector is kept after the release.
        self.on_release: Callable | None = None

    # -- helpers -----------------------------------------------------------------------------
    def _message(self, spec: pb.RoundSpec, spec_digest: str, phase: str,
                 body: bytes) -> pb.SignedEnvelope:
        return self.node.signing_key.sign(pb.PhaseMessage(
            round_id=spec.round_id, site_id=self.node.site_id, spec_digest=spec_digest,
            phase=phase, body=body, timestamp_unix_ms=now_ms(), nonce=new_nonce()))

    def _refuse(self, spec: pb.RoundSpec, spec_digest: str, reason: str) -> pb.SignedEnvelope:
        log.warning("refused secure round %s: %s", spec.round_id, reason)
        self._rounds.pop(spec.round_id, None)
        return self.node.refusal(spec.round_id, spec_digest, reason)

    def _check_policy(self, spec: pb.RoundSpec) -> None:
        """The site's policy check of ``spec`` at the "keys" and "release" notices
        (``site_policy.check_spec`` with the ledger's spend and total as they are now); raises
        PolicyViolation."""
        node = self.node
        site_policy.check_spec(spec, node.config.policy, site_id=node.site_id,
                               spent=node.ledger.spent,
                               total=node.ledger.total_epsilon, now_ms=now_ms())

    def _refuse_unanswerable(self, spec: pb.RoundSpec, spec_digest: str,
                             exc: site_policy.PolicyViolation | DataError) -> pb.SignedEnvelope:
        """The refusal of a round the site's policy or data cannot answer: a PolicyViolation's
        text is the public reason; a DataError's full detail stays in the site's log and only
        its ``public_reason`` leaves."""
        if isinstance(exc, site_policy.PolicyViolation):
            return self._refuse(spec, spec_digest, str(exc))
        log.error("refused round %s: %s", spec.round_id, exc)
        return self._refuse(spec, spec_digest, exc.public_reason)

    def forget_finished(self, now_ms: int) -> None:
        """Drop the in-memory state (secrets) of rounds past their deadline."""
        for rid in [r for r, s in self._rounds.items() if s.spec.deadline_unix_ms < now_ms]:
            del self._rounds[rid]

    # -- one notice -------------------------------------------------------------------------
    def handle_by_digest(self, notice: pb.PhaseNotice) -> pb.SignedEnvelope | None:
        """A notice after "keys" names its spec by digest only (under the node's lock): the
        spec this site verified and kept with the round's state, or, for a "release" notice
        after a restart, the stored release of that spec; otherwise nothing to answer."""
        rid, phase = notice.round_id, notice.phase
        self.forget_finished(now_ms())
        state = self._rounds.get(rid)
        if state is not None and state.spec_envelope is not None:
            if state.spec_digest != notice.spec_digest:
                log.warning("ignored a %s notice for round %s naming another spec", phase[:32],
                            rid)
                return None
            return self.handle(notice, state.spec_envelope, state.spec)
        stored = self.node.ledger.get_release(rid)
        if phase == "release" and stored is not None and stored.spec_digest == notice.spec_digest:
            log.info("round %s: already released; resending the stored masked release", rid)
            return self.node.fresh_envelope(stored)
        log.warning("round %s: %s notice, but this site holds no key state for the round (it "
                    "restarted, or missed the key step): it drops out of the round%s", rid,
                    phase[:32], "" if stored is None else
                    "; its masked release stands and the other holders' shares unmask it")
        return None

    def handle(self, notice: pb.PhaseNotice, spec_envelope: pb.SignedEnvelope,
               spec: pb.RoundSpec) -> pb.SignedEnvelope | None:
        """The answer to ``notice`` of the verified secure ``spec`` (under the node's lock):
        a signed PhaseMessage, the signed masked Contribution, a Refusal, or None (nothing to
        say: a notice this site cannot answer)."""
        spec_digest = digest(spec_envelope.payload)
        rid, phase = spec.round_id, notice.phase
        self.forget_finished(now_ms())
        state = self._rounds.get(rid)
        if state is not None and state.spec_digest != spec_digest:
            log.warning("ignored a %s notice for round %s with another spec", phase, rid)
            return None
        if state is not None and phase in state.answered:
            # The aggregator did not keep the answer (it restarted): the same body again.
            log.info("round %s: %s notice again; resending the same answer", rid, phase)
            if phase == "release":
                stored = self.node.ledger.get_release(rid)
                return None if stored is None else self.node.fresh_envelope(stored)
            return self._message(spec, spec_digest, ANSWER_PHASE[phase], state.answered[phase])
        if phase == "keys":
            return self._keys(notice, spec, spec_digest, spec_envelope)
        if phase == "release":
            stored = self.node.ledger.get_release(rid)
            if stored is not None:
                if stored.spec_digest != spec_digest:
                    return self._refuse(spec, spec_digest, f"round id {rid} was already "
                                        f"answered for a different spec")
                log.info("round %s: already released; resending the stored masked release",
                         rid)
                return self.node.fresh_envelope(stored)
        if state is None:
            log.warning("round %s: %s notice, but this site holds no key state for the round "
                        "(it restarted, or missed the key step): it drops out of the round%s",
                        rid, phase, "; nothing was drawn or debited"
                        if phase not in AFTER_RELEASE else
                        "; its masked release stands and the other holders' shares unmask it")
            return None
        try:
            if phase == "share_keys":
                body = state.session.share_keys(notice.body).to_bytes()
            elif phase == "release":
                return self._release(state, notice)
            elif phase == "confirm":
                body = state.session.confirm(notice.body).to_bytes()
            elif phase == "unmask":
                body = state.session.unmask(notice.body).to_bytes()
            else:
                log.warning("ignored a notice of unknown phase %r for round %s", phase[:32], rid)
                return None
        except SecAggError as exc:
            if phase in AFTER_RELEASE:   # it released: say why, locally
                log.error("round %s: %s request refused: %s: %s", rid, phase,
                          type(exc).__name__, exc)
                return None
            return self._refuse(spec, spec_digest, f"secure aggregation: {type(exc).__name__}: "
                                                   f"{exc}")
        state.answered[phase] = body
        return self._message(spec, spec_digest, ANSWER_PHASE[phase], body)

    def _keys(self, notice: pb.PhaseNotice, spec: pb.RoundSpec, spec_digest: str,
              spec_envelope: pb.SignedEnvelope) -> pb.SignedEnvelope:
        """The "keys" notice: check the participants and relayed keys, open the session,
        advertise this round's public keys."""
        node = self.node
        try:
            self._check_policy(spec)
        except site_policy.PolicyViolation as exc:
            return self._refuse(spec, spec_digest, str(exc))
        if node.ledger.get_release(spec.round_id) is not None:
            return self._refuse(spec, spec_digest, f"round id {spec.round_id} was already "
                                                   f"answered")
        participants = list(notice.participants)
        if node.site_id not in participants:
            return self._refuse(spec, spec_digest, "this site is not among the participants the "
                                                   "key notice names")
        outside = sorted(set(participants) - set(spec.sites)) if spec.sites else []
        if outside:
            return self._refuse(spec, spec_digest, f"the key notice names sites the spec does "
                                                   f"not invite: {', '.join(outside[:5])}")
        if not spec.aggregator_key_id:
            return self._refuse(spec, spec_digest, NO_AGGREGATOR_PIN)
        try:
            secure = secure_round.build(spec, participants)
            keys = secure_round.decode_keys(notice.body)
        except secure_round.SecureRoundError as exc:
            return self._refuse(spec, spec_digest, str(exc))
        # The aggregator's identity key, relayed under its secagg sender id: it must be the
        # one the coordinator pinned, and it signs every later notice body of the round.
        aggregator_key = keys.pop(AGGREGATOR, None)
        if aggregator_key is None:
            return self._refuse(spec, spec_digest, NO_AGGREGATOR_KEY)
        if key_id(aggregator_key) != spec.aggregator_key_id:
            return self._refuse(spec, spec_digest, WRONG_AGGREGATOR_KEY)
        holders = secure.config.graph().holders(node.site_id)
        # Every participant's key: survivors' signatures on the survivor set are checked
        # against them (each pinned by the coordinator in site_key_ids).
        missing = [h for h in participants if h not in keys]
        if missing:
            return self._refuse(spec, spec_digest, f"the key notice lacks the identity keys of "
                                                   f"{', '.join(missing[:5])}")
        own = node.signing_key.key_id
        if key_id(keys[node.site_id]) != own:
            return self._refuse(spec, spec_digest, "the key notice relays another identity key "
                                                   "for this site")
        if spec.site_key_ids:
            wrong = [h for h in participants if spec.site_key_ids.get(h) != key_id(keys[h])]
            if wrong:
                return self._refuse(spec, spec_digest,
                                    f"the aggregator relayed identity keys that differ from the "
                                    f"key ids the coordinator signed (site_key_ids) for "
                                    f"{', '.join(wrong[:5])}")
        session = SiteSession(secure.config, node.site_id, node.signing_key,
                              {h: keys[h] for h in participants},
                              aggregator_key=aggregator_key)
        body = session.advertise().to_bytes()
        state = _SecureState(spec, spec_digest, secure, session)
        state.spec_envelope = spec_envelope
        state.answered["keys"] = body
        self._rounds[spec.round_id] = state
        log.info("round %s: key agreement with %d holder(s) of %d participant(s) (T = %d, "
                 "t = %d); nothing drawn, nothing debited", spec.round_id, len(holders) - 1,
                 len(participants), secure.config.noise_threshold, secure.config.threshold)
        return self._message(spec, spec_digest, "advertise", body)

    def _release(self, state: _SecureState, notice: pb.PhaseNotice) -> pb.SignedEnvelope:
        """The "release" notice: fixed-point statistics + noise share, masked; debit and store
        the signed masked Contribution in one ledger transaction; return it to be sent."""
        node, spec, spec_digest = self.node, state.spec, state.spec_digest
        rid = spec.round_id
        if state.secure.joint:
            return self._release_joint(state, notice)
        try:
            self._check_policy(spec)
            neighbouring, _ = site_policy.round_mechanism(spec)
            data = node.data.load_round_data(node.config.data, spec.feature_names,
                                             spec.target, require_ids=node.per_patient)
        except (site_policy.PolicyViolation, DataError) as exc:
            return self._refuse_unanswerable(spec, spec_digest, exc)
        pre = spec.preprocessing
        preprocessing = node.round_preprocessing(spec)
        # Row-wise rules only: every usable row is used, however many (no cap, and never a
        # refusal that would say how many rows the site has). The statistics are exact
        # integers of the quantised rows (dpfed.secagg.exact): no float error to bound, so
        # max_site_rows only sizes the fixed-point grid. Then the per-patient filter
        # (SiteNode.select_patients): before the exact statistics.
        selection = node.single_target_rows(rid, spec, data, preprocessing)
        usable = selection.usable
        try:
            x, y = preprocessing.apply(data.x[usable], data.y[usable])
            stats = exact_clipped_statistics(x, y, spec.x_bound, spec.y_bound,
                                             row_norm_bound(pre.normalize_rows))
        except (NonFiniteRow, ValueError) as exc:   # not reached: such rows were left out
            log.error("refused round %s: pre-processing or statistics failed: %s", rid, exc)
            return self._refuse(spec, spec_digest, RELEASE_FAILED)
        charge = float(spec.epsilon)
        return self._mask_and_record(
            state, notice, stats, neighbouring, selection.charge(charge),
            f"released round {rid} (secure, masked; {neighbouring}): epsilon={charge:g}")

    def _mask_and_record(self, state: _SecureState, notice: pb.PhaseNotice, stats,
                         neighbouring: str, charged: dict, released: str) -> pb.SignedEnvelope:
        """The tail every secure release shares: encode the exact statistics, add this site's
        1/T noise share, mask; sign the Contribution; debit and store it in one ledger
        transaction (``charged``: the ledger's per-patient keywords, or {}); log ``released``
        and return the envelope (a retry: the stored one; a refusal if the ledger refuses)."""
        node, spec, spec_digest = self.node, state.spec, state.spec_digest
        rid = spec.round_id
        calibration = state.secure.calibration
        try:
            encoded = calibration.encode_exact(stats)
            vector = calibration.release_exact(stats)   # + this site's 1/T noise share
            if self.on_release is not None:
                self.on_release(rid, encoded, vector)
            masked = state.session.masked_input(notice.body, vector)
        except SecAggError as exc:
            # Nothing left the site: the share was drawn in memory only and is discarded.
            return self._refuse(spec, spec_digest, f"secure aggregation: {type(exc).__name__}: "
                                                   f"{exc}")
        charge = float(spec.epsilon)
        contribution = pb.Contribution(
            round_id=rid, site_id=node.site_id, masked=masked.to_bytes(),
            epsilon_spent=charge, spec_digest=spec_digest, timestamp_unix_ms=now_ms(),
            nonce=new_nonce(), noise=noise_to_proto(state.secure.share_noise()))
        signed = node.signing_key.sign(contribution)
        try:
            result = node.ledger.record_release(round_id=rid, spec_digest=spec_digest,
                                                epsilon=charge, n=0, envelope=signed,
                                                neighbouring=neighbouring, **charged)
        except (BudgetExhausted, RoundConflict) as exc:
            return self._refuse(spec, spec_digest, str(exc))
        state.answered["release"] = b""
        if not result.fresh:
            return node.fresh_envelope(result.release)
        log.info("%s, %s", released, node.ledger.budget_text())
        return result.release.envelope

    def _release_joint(self, state: _SecureState, notice: pb.PhaseNotice) -> pb.SignedEnvelope:
        """The "release" notice of a JOINT secure round (issue 23): every target column read,
        the features pre-processed and each response standardised by its TargetSpec as the
        independent joint release does (``SiteNode._release_joint``; a response that is not
        finite afterwards is missing), the per-patient filter with the round's event
        (``SecureRound.event``: PureDP(eps) or the Skellam event of the grid calibration),
        exact integer statistics of the quantised rows (``joint_exact_clipped_statistics``),
        this site's 1/T share of the distributed noise, masked; then debit and store in one
        ledger transaction, as the single-target path."""
        node, spec, spec_digest = self.node, state.spec, state.spec_digest
        rid = spec.round_id
        calibration = state.secure.calibration
        try:
            self._check_policy(spec)
            data = node.data.load_joint_round_data(node.config.data, spec.feature_names,
                                                   [t.name for t in spec.targets],
                                                   require_ids=node.per_patient)
        except (site_policy.PolicyViolation, DataError) as exc:
            return self._refuse_unanswerable(spec, spec_digest, exc)
        pre = spec.preprocessing
        preprocessing = node.round_preprocessing(spec, joint=True)
        zeros = np.zeros(data.x.shape[0])
        usable = finite_after_preprocessing(preprocessing, data.x, zeros)
        log_left_out(rid, "response", data, int((~usable).sum()))
        event = state.secure.event()
        selection = node.select_patients(rid, data, usable, float(spec.epsilon), event)
        usable = selection.usable
        try:
            x, _ = preprocessing.apply(data.x[usable], zeros[usable])
            centre = np.array([t.y_mean for t in spec.targets])
            scale = np.array([t.y_scale for t in spec.targets])
            with np.errstate(over="ignore", invalid="ignore"):
                y = (np.asarray(data.y, dtype=np.float64)[usable] - centre) / scale
            y[~np.isfinite(y)] = np.nan        # cell-wise: that response is missing
            stats = joint_exact_clipped_statistics(x, y, spec.x_bound, spec.y_bound,
                                                   row_norm_bound(pre.normalize_rows))
        except (NonFiniteRow, ValueError, SecAggError) as exc:   # not reached: rows left out
            log.error("refused round %s: pre-processing or statistics failed: %s", rid, exc)
            return self._refuse(spec, spec_digest, RELEASE_FAILED)
        charge = float(spec.epsilon)
        per_patient = selection.charge(charge)
        if per_patient:
            per_patient["event"] = event
        at_delta = f" at delta {spec.delta:g}" if calibration.mechanism == "gaussian" else ""
        return self._mask_and_record(
            state, notice, stats, "add_remove", per_patient or {"event": event},
            f"released joint round {rid} (secure, masked, {calibration.mechanism}, "
            f"{len(spec.targets)} targets): epsilon={charge:g}{at_delta}")


def joint_exact_clipped_statistics(x, y, x_bound: float, y_bound: float,
                                   x_norm_bound: float | None = None) -> JointExactStatistics:
    """The exact joint statistics a site encodes in a secure joint round
    (``dpfed.secagg.exact.JointExactStatistics``): features clipped to the box and projected
    into the ball (``site_node.release.clip``, ``project_rows``, as
    ``site_node.joint_release``), present responses (``y`` (n, m), NaN = missing) clipped to
    [-y_bound, y_bound], every value quantised toward zero to the round's power-of-two grid
    (``dpfed.secagg.exact.quantize``), then summed exactly in integers. Any number of rows.
    ValueError (naming no value) for a non-finite feature or an infinite response."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or y.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ValueError("x must be (n, d) and y (n, m) with the same rows")
    if not np.all(np.isfinite(x)) or np.any(np.isinf(y)):
        raise ValueError("x must be finite and y finite or NaN (missing)")
    qx, qy = quantum_exponents(x_bound, y_bound, x_norm_bound)
    z = clip(x, x_bound)
    if x_norm_bound is not None:
        project_rows(z, x_norm_bound)
    present = ~np.isnan(y)
    u = np.where(present, clip(np.nan_to_num(y), y_bound), 0.0)
    return joint_exact_statistics(quantize(z, qx), quantize(u, qy), present, qx=qx, qy=qy)
