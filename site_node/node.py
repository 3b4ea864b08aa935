"""The site node's decisions for one round: consent, then release once, record, sign.

A round has phases (docs/protocol.md). ``SiteNode.consent`` answers the pushed, signed
RoundSpec in the consent phase with a signed consent (PhaseMessage) or a Refusal: steps 1-3
below and the data checks of step 4, with nothing drawn and nothing debited.
``SiteNode.handle_notice`` answers the aggregator's release notice (which carries the same
signed spec) with ``handle_round``: a plain method (no gRPC) that turns the signed RoundSpec
into the signed envelope to send back, a Contribution, or a Refusal saying why. The order of
the steps is the privacy argument:

1. verify the coordinator's signature before reading anything in the spec (site_node.policy);
2. if this round id was already answered, return the stored envelope byte for byte, never
   fresh noise ("re-releasing is re-spending", method.md section 6); a different spec under
   the same round id is refused;
3. check the policy (epsilon, budget, target/features, bounds, split, dimensions, the
   neighbouring relation: replace_one only if ``policy.allow_replace_one``);
4. load the data, apply the *public* pre-processing (method.md section 2, step 1) and release
   with OpenDP's noise (site_node.release). Which rows are used is decided row by row
   (site_node.data, site_node.rows: a missing target, a malformed or non-finite value, a
   repeated id leave that row out); nothing about the rows decides whether the site answers,
   and only counts go to the site's own log (docs/security.md, "What a refusal reveals");
5. min_n: under replace-one n is public by assumption and checked exactly, before the release.
   Under add/remove the exact n is private, so it is never compared with anything: the
   release (including its noisy n) is drawn first and the *noisy* n is compared with min_n.
   A refusal then reveals only whether a DP value is below a public threshold
   (post-processing), and it is paid for: the epsilon is debited and the signed Refusal is
   stored in the ledger as this round's answer, so a retry gets the same refusal and never
   fresh noise (docs/security.md);
6. sign the Contribution (or that Refusal) and debit + store it in one ledger transaction;
   only then is it returned to be sent.

Joint rounds (``spec.targets``: m responses in one release, issue 23) take the same steps
with ``site_node.joint_release``: the data file's every target column is read (a row is left
out for its features or id only; a missing response is missing for that target only), each
response standardised by its TargetSpec, the noise Laplace (pure eps) or Gaussian ((eps,
delta), only under a per-patient (eps, delta) budget: site_node.policy.check_mechanism), and
the ledger charged the calibration's event (PureDP(eps) or Gaussian(mu)).

Secure rounds (spec.aggregation = "secure") use the same consent; their later steps (key
agreement, masked release, unmasking) arrive as notices with a body and are answered by
``site_node.secure.SecureSite`` (docs/protocol.md, "Secure rounds"); a secure spec is never
released independently.

A crash after step 5 leaves a stored, unsent release that the client resends on startup;
a crash before it leaves nothing debited and nothing sent. A stored answer older than
``RESIGN_AFTER_MS`` is re-signed with a fresh timestamp and nonce over the same stored bytes
before it is sent (``fresh_envelope``): never fresh noise, and the aggregator's clock-skew
window does not turn a delayed release into a lost one.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import numpy as np

from dpfed import __version__
from dpfed import secure_round
from dpfed.accounting import PureDP
from dpfed.audit import AuditLog
from dpfed.noise import to_proto as noise_to_proto
from dpfed.preprocess import NonFiniteRow, Preprocessing
from dpfed.sensitivity import row_norm_bound
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire import limits
from dpfed.wire.canonical import CanonicalError, digest, parse_canonical
from dpfed.wire.signing import SigningKey
from site_node import policy as site_policy
from site_node.client import SiteClient
from site_node.config import SiteConfig
from site_node.data import DataError
from site_node.data_cache import DataCache
# LedgerMismatch lives with the other ledger errors (the client stops on it too).
from site_node.ledger import BudgetExhausted, LedgerMismatch, PrivacyLedger, RoundConflict
# The shared vocabulary (site_node.messages), named here too: callers and tests use
# site_node.node.now_ms, CONTRIBUTION, ... as before.
from site_node.messages import (CONTRIBUTION, PHASE_MESSAGE, PHASE_NOTICE,  # noqa: F401
                                REFUSAL, RELEASE_FAILED, ROUND_SPEC, new_nonce, now_ms)
from site_node.joint_release import release_joint_statistics
from site_node.release import release_statistics
from site_node.rows import finite_after_preprocessing, log_left_out
from site_node.secure import SecureSite

log = logging.getLogger(__name__)

# A stored answer older than this is re-signed (fresh timestamp and nonce, same statistics
# bytes) before it is sent again: well inside the aggregator's default clock-skew window
# (300 s), so a resend is never refused as stale.
RESIGN_AFTER_MS = 60_000


# Slack when comparing the ledger's spend with the aggregator's record (sums of the same
# epsilons in another order).
HISTORY_SLACK = 1e-6


class SiteNode:
    """One hospital's node: its config, signing key, coordinator keys and privacy ledger."""

    def __init__(self, config: SiteConfig, *, signing_key: SigningKey | None = None,
                 ledger: PrivacyLedger | None = None, audit: AuditLog | None = None):
        self.config = config
        self.signing_key = signing_key or SigningKey.load(config.signing_key)
        self.trusted = site_policy.trusted_keys(config.policy.trusted_coordinators)
        self.ledger = ledger or PrivacyLedger(config.state_db, site_id=config.site_id,
                                              total_epsilon=config.policy.total_epsilon,
                                              patient_epsilon=config.policy.patient_epsilon,
                                              patient_delta=config.policy.patient_delta)
        # A per-patient budget: the patient key must be there (or is created, for a ledger
        # without patients) before the site serves; LedgerError otherwise.
        self.per_patient = config.policy.patient_epsilon is not None
        if self.per_patient:
            self.ledger.patient_hasher()
        # The audit log of every request received and answer sent (dpfed.audit), written by
        # the client at the wire (site_node.client) with this node's key; its latest signed
        # head is also kept in the ledger, so a truncated log is detected (docs/audit.md).
        # AuditError here: the site does not start (fail closed).
        self.audit = audit or AuditLog(
            config.audit_path, party=config.site_id, signing_key=self.signing_key,
            on_head=lambda head: self.ledger.record_audit_head(head.seq, head.to_json()))
        # One round at a time in this process; other processes are kept out by the ledger's
        # write lock.
        self._lock = threading.Lock()
        # Why this node may serve no round (check_history), or None.
        self.blocked: str | None = None
        # The data file parsed at consent, reused at release while its bytes are the same
        # (site_node.data_cache: keyed by path, size, mtime and SHA-256 of the content).
        self.data = DataCache()
        # Secure rounds: the in-memory key state of each (site_node.secure), composed here:
        # SecureSite is given this node (its keys, ledger, config) and never imports it.
        self.secure = SecureSite(self)

    @property
    def site_id(self) -> str:
        return self.config.site_id

    # -- signed messages this site sends ---------------------------------------------------
    def hello(self) -> pb.SignedEnvelope:
        """The signed SiteHello: it declares the ledger's total budget (the aggregator refuses
        contributions beyond it) and the key ids of the trusted coordinators (the only ones
        the aggregator shows this site's n, epsilon and refusal reasons to)."""
        return self.signing_key.sign(pb.SiteHello(
            site_id=self.site_id, timestamp_unix_ms=now_ms(), nonce=new_nonce(),
            software_version=__version__, total_epsilon=self.ledger.total_epsilon or 0.0,
            trusted_coordinator_key_ids=sorted(self.trusted)))

    def refusal(self, round_id: str, spec_digest: str, reason: str,
                epsilon_spent: float = 0.0) -> pb.SignedEnvelope:
        # Kept inside the wire limits, so the aggregator never rejects an honest refusal.
        return self.signing_key.sign(pb.Refusal(round_id=limits.clip_id(round_id),
                                                site_id=self.site_id, spec_digest=spec_digest,
                                                reason=limits.clip_text(reason),
                                                timestamp_unix_ms=now_ms(), nonce=new_nonce(),
                                                epsilon_spent=epsilon_spent))

    def check_history(self, history: pb.SiteHistory) -> None:
        """Compare the ledger with the aggregator's record of this site (GetSiteHistory).
        Raises LedgerMismatch (and sets ``blocked``: every round is refused) when

        * the aggregator records more epsilon spent than the ledger knows: the ledger was
          deleted, replaced or restored from an old backup. Its figure is never taken as
          *lower* than the ledger's (the ledger's own spend always counts), and a larger one
          is only carried over by the operator (``dpfed site ledger --acknowledge-reset``);
        * the ledger's total is larger than the total the site last declared to the aggregator,
          and no explicit raise (``dpfed site ledger --raise-total``) set it: a new ledger
          created with a larger total_epsilon.
        """
        spent, total = self.ledger.spent, self.ledger.total_epsilon or 0.0
        problem = None
        fix = ("restore the state_db from its backup, or, if it is lost, acknowledge the "
               "reset with `dpfed site ledger --acknowledge-reset --config <site.toml>` (the "
               "ledger then continues from the aggregator's figure)")
        if history.spent_epsilon > spent + HISTORY_SLACK:
            what = ("is empty (a new or deleted state_db)" if not self.ledger.releases()
                    and spent == 0 else f"records only epsilon {spent:g} (an old backup, or "
                    f"another copy of the state_db?)")
            problem = (f"the aggregator records epsilon {history.spent_epsilon:g} spent by "
                       f"site {self.site_id!r} over {history.rounds} round(s), but the privacy "
                       f"ledger {self.ledger.path} {what}. Serving no rounds: {fix}")
        elif (history.declared_total_epsilon > 0
              and total > history.declared_total_epsilon + HISTORY_SLACK
              and not self.ledger.total_explicitly_raised()):
            problem = (f"the privacy ledger {self.ledger.path} has total_epsilon {total:g}, but "
                       f"this site last declared {history.declared_total_epsilon:g} to the "
                       f"aggregator and no explicit raise is recorded (a new ledger cannot "
                       f"raise the budget). Serving no rounds: set policy.total_epsilon to "
                       f"{history.declared_total_epsilon:g}, or {fix}, then record a raise "
                       f"with `dpfed site ledger --raise-total`")
        self.blocked = problem
        if problem:
            log.error("%s", problem)
            raise LedgerMismatch(problem)
        log.info("ledger agrees with the aggregator's record: spent %g here, %g recorded there "
                 "over %d round(s)", spent, history.spent_epsilon, history.rounds)

    # -- the per-patient filter ------------------------------------------------------------
    def select_patients(self, round_id: str, data, usable: np.ndarray,
                        epsilon: float, event=None) -> "PatientSelection":
        """The individual filter (site_node.patients; docs/method.md section 13): of the rows
        ``usable`` after the row-wise rules, keep those whose patient's own ledger history
        admits a release of ``event`` (default PureDP(epsilon); a Gaussian round's is
        Gaussian(mu)); the others are left out before clipping and the statistics. Without a
        per-patient budget every usable row is kept and the release is charged to every
        patient."""
        if not self.per_patient:
            return PatientSelection(usable, None, (), None)
        event = event or PureDP(epsilon)
        budget = self.ledger.patient_budget()
        keys = self.ledger.patient_hasher().keys_of(data.ids)
        candidates = np.flatnonzero(usable)
        ok = np.asarray(self.ledger.admitted([keys[i] for i in candidates], event,
                                             budget), dtype=bool).reshape(-1)
        usable = usable.copy()
        left = candidates[~ok]
        usable[left] = False
        if left.size:   # counts for the site's own log only
            log.info("round %s: %d patient(s) left out: their remaining budget does not cover "
                     "epsilon %g", round_id, left.size, epsilon)
        return PatientSelection(usable, [keys[i] for i in np.flatnonzero(usable)],
                                [keys[i] for i in left], budget, event)

    @staticmethod
    def round_preprocessing(spec: pb.RoundSpec, *, joint: bool = False) -> Preprocessing:
        """The round's public pre-processing (``spec.preprocessing``; module docstring, step
        4), for the independent and the secure release alike. A joint round pre-processes the
        features only: its y_mean is not used (0), each response is standardised by its
        TargetSpec."""
        pre = spec.preprocessing
        return Preprocessing(tuple(pre.x_mean), 0.0 if joint else pre.y_mean,
                             pre.normalize_rows, source=spec.public_source or "coordinator",
                             x_scale=tuple(pre.x_scale))

    def single_target_rows(self, round_id: str, spec: pb.RoundSpec, data,
                           preprocessing: Preprocessing) -> "PatientSelection":
        """The rows a single-target release uses (independent or secure): those the row-wise
        rules keep, i.e. finite after ``preprocessing`` (site_node.rows; the count left out
        goes to the site's own log only), then the per-patient filter at the round's epsilon
        (``select_patients``), in that order."""
        usable = finite_after_preprocessing(preprocessing, data.x, data.y)
        log_left_out(round_id, spec.target, data, int((~usable).sum()))
        return self.select_patients(round_id, data, usable, float(spec.epsilon))

    # -- one round ---------------------------------------------------------------------------
    def consent(self, envelope: pb.SignedEnvelope) -> pb.SignedEnvelope:
        """The consent phase: a signed PhaseMessage("consent") if this site would release for
        the signed RoundSpec ``envelope`` (spec verified, policy and budget allow it, the data
        file is readable and has the columns the round names), else a signed Refusal saying
        why. Nothing is drawn, debited or stored: a refusal here costs the site nothing, so it
        depends on public inputs only, never on the rows (not even on their number)."""
        with self._lock:
            return self._handle_round(envelope, release=False)

    def handle_notice(self, envelope: pb.SignedEnvelope) -> pb.SignedEnvelope:
        """The release phase: the aggregator's PhaseNotice (unsigned; it arrives on the TLS
        stream) names the participants and carries the coordinator-signed spec, which is
        verified again by ``handle_round``: a notice can only ask for a release the
        coordinator specified, and the ledger answers a round id once."""
        try:
            if envelope.payload_type != PHASE_NOTICE:
                raise CanonicalError(f"expected a {PHASE_NOTICE}, got {envelope.payload_type!r}")
            notice = parse_canonical(envelope.payload, PHASE_NOTICE)
            spec_envelope = pb.SignedEnvelope.FromString(notice.spec_envelope)
        except Exception:  # noqa: BLE001 - a malformed notice is answered by nothing
            log.warning("ignored a malformed release notice from the aggregator")
            return None
        if not notice.spec_envelope and notice.spec_digest:
            # A later step of a secure round: the spec was verified at its "keys" notice.
            if self.blocked:
                return None
            with self._lock:
                return self.secure.handle_by_digest(notice)
        if notice.phase != "release" or notice.body:
            return self._secure_notice(notice, spec_envelope)
        if self.site_id not in notice.participants:
            log.warning("ignored a release notice for round %s: phase %r, this site %s a "
                        "participant", limits.clip_id(notice.round_id) or "?", notice.phase,
                        "is" if self.site_id in notice.participants else "is not")
            return None
        return self.handle_round(spec_envelope)

    def _secure_notice(self, notice: pb.PhaseNotice,
                       spec_envelope: pb.SignedEnvelope) -> pb.SignedEnvelope | None:
        """A notice of a secure round's step (site_node.secure), after verifying its spec:
        a notice whose spec does not verify, or is not a secure spec, is answered by nothing
        (the notice itself is unsigned; the spec is what authorises a step)."""
        if self.blocked:
            return None
        try:
            spec = site_policy.verify_spec(spec_envelope, self.trusted)
            limits.check_spec(spec)
        except (site_policy.PolicyViolation, limits.LimitError) as exc:
            log.warning("ignored a %s notice: %s", limits.clip_text(notice.phase, 32), exc)
            return None
        if not secure_round.is_secure(spec) or notice.round_id != spec.round_id:
            log.warning("ignored a %s notice for round %s: not a secure round's notice",
                        limits.clip_text(notice.phase, 32), spec.round_id)
            return None
        with self._lock:
            return self.secure.handle(notice, spec_envelope, spec)

    def handle_round(self, envelope: pb.SignedEnvelope) -> pb.SignedEnvelope:
        """The signed Contribution or Refusal answering the signed RoundSpec ``envelope``."""
        with self._lock:
            return self._handle_round(envelope)

    def fresh_envelope(self, release) -> pb.SignedEnvelope:
        """``release``'s stored envelope, re-signed with a fresh timestamp and nonce if it is
        older than RESIGN_AFTER_MS (the same answer and statistics bytes: ledger.
        replace_envelope refuses anything else), and the ledger updated to hold it."""
        env = release.envelope
        try:
            msg = parse_canonical(env.payload, env.payload_type)
        except CanonicalError:
            return env
        if now_ms() - msg.timestamp_unix_ms <= RESIGN_AFTER_MS:
            return env
        msg.timestamp_unix_ms = now_ms()
        msg.nonce = new_nonce()
        resigned = self.signing_key.sign(msg)
        self.ledger.replace_envelope(release.round_id, resigned)
        log.info("round %s: the stored answer was re-signed with a fresh timestamp (same "
                 "statistics, no new noise)", release.round_id)
        return resigned

    def _consent_message(self, round_id: str, spec_digest: str) -> pb.SignedEnvelope:
        return self.signing_key.sign(pb.PhaseMessage(
            round_id=round_id, site_id=self.site_id, spec_digest=spec_digest, phase="consent",
            timestamp_unix_ms=now_ms(), nonce=new_nonce()))

    def _handle_round(self, envelope: pb.SignedEnvelope, *,
                      release: bool = True) -> pb.SignedEnvelope:
        spec_digest = digest(envelope.payload)
        if self.blocked:
            return self.refusal(_untrusted_round_id(envelope), spec_digest,
                                "the site's privacy ledger disagrees with the aggregator's "
                                "record; the site operator must restore it or acknowledge "
                                "the reset (see the site log)")
        try:
            spec = site_policy.verify_spec(envelope, self.trusted)
        except site_policy.PolicyViolation as exc:
            round_id = _untrusted_round_id(envelope)
            log.warning("refused round %s (spec %s): %s", round_id or "?", spec_digest[:12], exc)
            return self.refusal(round_id, spec_digest, str(exc))
        try:
            # The same wire limits the aggregator enforces (d <= 512, id formats, finite
            # values), before the ledger or the data file is touched.
            limits.check_spec(spec)
        except limits.LimitError as exc:
            round_id = limits.clip_id(spec.round_id)
            log.warning("refused round %s: %s", round_id or "?", exc)
            return self.refusal(round_id, spec_digest, str(exc))
        round_id = spec.round_id
        log.info("received round %s (spec %s): target=%s, d=%d, epsilon=%g", round_id,
                 spec_digest[:12], spec.target, len(spec.feature_names), spec.epsilon)

        stored = self.ledger.get_release(round_id)
        if stored is not None:
            if stored.spec_digest == spec_digest:
                if not release:   # it will send the stored release when notified
                    return self._consent_message(round_id, spec_digest)
                log.info("round %s was already answered: returning the stored release "
                         "(no new noise, nothing debited)", round_id)
                return self.fresh_envelope(stored)
            reason = (f"round id {round_id} was already answered for a different spec "
                      f"({stored.spec_digest[:12]}); a round id is answered once")
            log.warning("refused round %s: %s", round_id, reason)
            return self.refusal(round_id, spec_digest, reason)

        try:
            site_policy.check_spec(spec, self.config.policy, site_id=self.site_id,
                                   spent=self.ledger.spent, total=self.ledger.total_epsilon,
                                   now_ms=now_ms())
            neighbouring, xtx_rule = site_policy.round_mechanism(spec)
            if spec.targets:   # a joint round (issue 23): its calibration, then every target
                calibration = joint_calibration(spec)
                data = self.data.load_joint_round_data(
                    self.config.data, spec.feature_names, [t.name for t in spec.targets],
                    require_ids=self.per_patient)
            else:
                data = self.data.load_round_data(self.config.data, spec.feature_names,
                                                 spec.target, require_ids=self.per_patient)
            if neighbouring == "replace_one":
                # n is public under replace-one: the exact check reveals nothing more.
                site_policy.check_n(data.n, self.config.policy)
            if secure_round.is_secure(spec):
                # A secure round: the site releases only a masked input, in the secure
                # release step (site_node.secure), of all its usable rows (max_site_rows only
                # sizes the grid); never an independent release for a secure spec.
                if release:
                    raise site_policy.PolicyViolation(
                        "this is a secure round: the site releases only its masked input, in "
                        "the release step of secure aggregation")
        except site_policy.PolicyViolation as exc:
            log.warning("refused round %s: %s", round_id, exc)
            return self.refusal(round_id, spec_digest, str(exc))
        except DataError as exc:
            log.error("refused round %s: %s", round_id, exc)  # full detail stays local
            return self.refusal(round_id, spec_digest, exc.public_reason)
        if not release:
            log.info("consented to round %s (nothing drawn, nothing debited)", round_id)
            return self._consent_message(round_id, spec_digest)

        if spec.targets:
            return self._release_joint(spec, spec_digest, data, calibration)
        pre = spec.preprocessing
        preprocessing = self.round_preprocessing(spec)
        selection = self.single_target_rows(round_id, spec, data, preprocessing)
        usable = selection.usable
        try:
            x, y = preprocessing.apply(data.x[usable], data.y[usable])
        except NonFiniteRow:   # not reached: the rows it would name were left out above
            log.error("refused round %s: pre-processing gave a non-finite number", round_id)
            return self.refusal(round_id, spec_digest, RELEASE_FAILED)
        try:
            stats, info = release_statistics(x, y, epsilon=spec.epsilon, x_bound=spec.x_bound,
                                             y_bound=spec.y_bound,
                                             budget_split=tuple(spec.budget_split),
                                             neighbouring=neighbouring,
                                             xtx_sensitivity=xtx_rule,
                                             x_norm_bound=row_norm_bound(pre.normalize_rows),
                                             return_info=True)
        except ValueError as exc:
            log.error("refused round %s: release failed: %s", round_id, exc)
            return self.refusal(round_id, spec_digest, RELEASE_FAILED)
        # Charge what OpenDP certifies if it were ever more than the nominal epsilon.
        charge = max(float(spec.epsilon), float(info["epsilon_certified"]))

        # Decided on the noisy n only (module docstring, step 5).
        refused = neighbouring == "add_remove" and stats.n < self.config.policy.min_n
        # n = stats.n: the released n (noisy under add/remove, exact under replace-one).
        return self._sign_and_record(
            spec, spec_digest, stats, stats.n, charge, refused, neighbouring,
            selection.charge(charge),
            f"released round {round_id} ({neighbouring}, Sxx {xtx_rule}): n={stats.n}"
            f"{' (noisy)' if neighbouring == 'add_remove' else ''}, epsilon={charge:g}")

    def _sign_and_record(self, spec: pb.RoundSpec, spec_digest: str, stats, n: int,
                         charge: float, refused: bool, neighbouring: str, charged: dict,
                         released: str) -> pb.SignedEnvelope:
        """Steps 5-6 of the module docstring, shared by the single-target and the joint
        central release: the signed Contribution of ``stats`` (released count ``n``), or, when
        ``refused`` (the noisy n below min_n), the signed Refusal that is this round's
        answer; debited (``charge``; ``charged``: the ledger's per-patient or event keywords)
        and stored in one ledger transaction, then returned. A concurrent answer of the round
        is returned instead (our fresh noise is discarded unsent); a ledger refusal becomes a
        Refusal. ``released``: the site log's line of a release."""
        round_id = spec.round_id
        if refused:
            # The noise was drawn, so the epsilon is debited and this refusal is stored as
            # the round's answer (module docstring, step 5).
            signed = self.refusal(round_id, spec_digest, site_policy.NOISY_MIN_N_REASON,
                                  epsilon_spent=charge)
        else:
            contribution = pb.Contribution(round_id=round_id, site_id=self.site_id,
                                           statistics=stats.to_bytes(), n=n,
                                           epsilon_spent=charge, spec_digest=spec_digest,
                                           timestamp_unix_ms=now_ms(), nonce=new_nonce(),
                                           noise=noise_to_proto(stats.noise))
            signed = self.signing_key.sign(contribution)
        try:
            result = self.ledger.record_release(round_id=round_id, spec_digest=spec_digest,
                                                epsilon=charge, n=n, envelope=signed,
                                                neighbouring=neighbouring, **charged)
        except (BudgetExhausted, RoundConflict) as exc:
            # Another process got there first; our fresh noise is discarded unsent.
            log.warning("refused round %s: %s", round_id, exc)
            return self.refusal(round_id, spec_digest, str(exc))
        if not result.fresh:
            log.info("round %s was answered concurrently: returning that stored release", round_id)
            return self.fresh_envelope(result.release)
        if refused:
            log.warning("refused round %s after drawing its release: noisy n %d < min_n %d "
                        "(epsilon %g debited; the refusal is stored as the round's answer)",
                        round_id, n, self.config.policy.min_n, charge)
            return result.release.envelope
        log.info("%s, %s", released, self.ledger.budget_text())
        return result.release.envelope

    def _release_joint(self, spec: pb.RoundSpec, spec_digest: str, data,
                       calibration) -> pb.SignedEnvelope:
        """Steps 4-6 of the module docstring for a joint round (site_node.joint_release):
        the features pre-processed as a single-target round's (``spec.preprocessing``; its
        y_mean is not used), each response standardised by its TargetSpec, (y - y_mean) /
        y_scale (a cell that is not finite afterwards is missing), the per-patient filter
        with the calibration's event (PureDP(eps) or Gaussian(mu)), one release, the noisy
        n_x compared with min_n, and the debit + stored answer in one ledger transaction."""
        round_id = spec.round_id
        preprocessing = self.round_preprocessing(spec, joint=True)
        zeros = np.zeros(data.x.shape[0])
        usable = finite_after_preprocessing(preprocessing, data.x, zeros)
        if data.left_out or not usable.all() or data.dropped_missing_target:
            # Counts only, for the site's own log. Missing responses leave no row out.
            log.info("round %s: left out %d malformed row(s) (a feature or id that is not "
                     "usable) and %d whose pre-processing is not finite; %d response cell(s) "
                     "missing (those targets only)", round_id, data.left_out,
                     int((~usable).sum()), data.dropped_missing_target)
        event = calibration.event()
        selection = self.select_patients(round_id, data, usable, float(spec.epsilon), event)
        usable = selection.usable
        try:
            x, _ = preprocessing.apply(data.x[usable], zeros[usable])
        except NonFiniteRow:   # not reached: the rows it would name were left out above
            log.error("refused round %s: pre-processing gave a non-finite number", round_id)
            return self.refusal(round_id, spec_digest, RELEASE_FAILED)
        centre = np.array([t.y_mean for t in spec.targets])
        scale = np.array([t.y_scale for t in spec.targets])
        with np.errstate(over="ignore", invalid="ignore"):
            y = (data.y[usable] - centre) / scale
        y[~np.isfinite(y)] = np.nan   # cell-wise: that response is missing
        try:
            stats, info = release_joint_statistics(x, y, calibration, return_info=True)
        except ValueError as exc:
            log.error("refused round %s: joint release failed: %s", round_id, exc)
            return self.refusal(round_id, spec_digest, RELEASE_FAILED)
        # The site-wide debit: the round's eps (at its delta, for a Gaussian round), or what
        # OpenDP certifies if that were ever more (Laplace).
        charge = float(spec.epsilon)
        if calibration.mechanism == "laplace":
            charge = max(charge, float(info["epsilon_certified"]))
            event = PureDP(charge)
        per_patient = selection.charge(charge)
        if per_patient:
            per_patient["event"] = event
        at_delta = f" at delta {spec.delta:g}" if calibration.mechanism == "gaussian" else ""
        return self._sign_and_record(
            spec, spec_digest, stats, stats.n_x, charge, stats.n_x < self.config.policy.min_n,
            "add_remove", per_patient or {"event": event},
            f"released joint round {round_id} ({calibration.mechanism}, {len(spec.targets)} "
            f"targets): n_x={stats.n_x} (noisy), epsilon={charge:g}{at_delta}")

    def run(self, stop=None) -> None:
        """Serve forever: dial the aggregator, answer rounds, reconnect (site_node.client,
        which is given this node and asks it for every answer)."""
        SiteClient(self).run(stop)


@dataclass(frozen=True)
class PatientSelection:
    """The rows a release uses after the per-patient filter (``SiteNode.select_patients``):
    ``usable`` the row mask; ``included`` their patients' ledger keys (None: no per-patient
    budget, the release is charged to every patient); ``seen`` the candidates left out."""

    usable: np.ndarray
    included: list | None
    seen: list | tuple
    budget: object
    # The event the filter admitted (None: PureDP of the charged epsilon).
    event: object = None

    def charge(self, epsilon: float) -> dict:
        """The per-patient arguments of ``PrivacyLedger.record_release``."""
        if self.included is None:
            return {}
        event = PureDP(epsilon) if self.event is None or isinstance(self.event, PureDP) \
            else self.event
        return {"patients": self.included, "seen": self.seen, "event": event,
                "patient_budget": self.budget}


def joint_calibration(spec: pb.RoundSpec):
    """``dpfed.joint_noise.calibration_from_spec``, its ValueError as a PolicyViolation (the
    spec's public parameters only; nothing drawn)."""
    from dpfed.joint_noise import calibration_from_spec
    try:
        return calibration_from_spec(spec)
    except ValueError as exc:
        raise site_policy.PolicyViolation(f"invalid joint round parameters: {exc}") from None


def _untrusted_round_id(envelope: pb.SignedEnvelope) -> str:
    """The round id of an envelope that did NOT verify, only to label the refusal so the
    coordinator can match it; nothing else in it is used."""
    if envelope.payload_type != "dpfed.v1.RoundSpec":
        return ""
    try:
        return limits.clip_id(parse_canonical(envelope.payload, "dpfed.v1.RoundSpec").round_id)
    except CanonicalError:
        return ""
