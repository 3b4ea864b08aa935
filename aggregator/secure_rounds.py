"""Secure rounds at the aggregator: the steps after consent, as methods of RoundManager.

A round whose signed spec says ``aggregation = "secure"`` (docs/protocol.md, "Secure rounds";
dpfed.secure_round) goes, once consent has fixed its participants, through the steps of the
secure-aggregation core (dpfed.secagg.protocol.AggregatorSession):

    KEYS     advertise   notice "keys" (participants, the identity keys of the site's
                         holders) -> SendPhase("advertise", KeyAdvertisement)
             share_keys  notice "share_keys" (AdvertisementBundle) -> SendPhase("share_keys")
    RELEASE  release     notice "release" (ShareDelivery) -> Contribute(masked)   (debit here)
    UNMASK   confirm     notice "confirm" (SurvivorList) -> SendPhase("confirm",
                         SurvivorSignature): every survivor signs the one survivor set
             unmask      notice "unmask" (UnmaskRequest: the set, the quorum's signatures, the
                         holders' attestations) -> SendPhase("unmask", UnmaskResponse)
    FITTING  the session's sum, decoded, fitted with the noise of C shares of 1/T draw

Each step ends when every site it waits for answered (or refused), or at its own deadline
(``STEP_WEIGHT`` shares of the time left to the round's deadline); the unmask step ends as
soon as every needed secret has t shares. A step the secagg core cannot close (too few
survivors, a share that fails its commitment) fails the round with the core's reason.

Signatures: the aggregator signs every secagg message it sends (bundles, deliveries, survivor
lists, unmask requests and the survivor certificate) with its identity key (aggregator.toml
``signing_key``); the "keys" notice relays its public key beside the sites' (under the secagg
sender id of the aggregator, ``dpfed.secagg.messages.AGGREGATOR``), and each site checks it
against the key id the coordinator signed into the spec (``aggregator_key_id``) before it
advertises anything, then verifies every later message with it. Without a signing key, or with
another key than the spec pins, no secure round starts (``_signing_problem``).

Durability: every message the session consumed is in the store before it is counted (the key
and unmask messages in ``phase_messages``, the masked releases in ``contributions``), together
with its nonce, in one group commit; a step change is one transaction (state, step, its
deadline). The session's outputs are deterministic functions of what it consumed (Ed25519
signatures are deterministic, RFC 8032), so ``_replay`` rebuilds it after a restart by feeding
the stored messages through the same steps, and the sites are pushed the same notices again,
byte for byte.
"""

from __future__ import annotations

import logging

from dpfed import secure_round
from dpfed.secagg import errors as secagg_errors
from dpfed.secagg.messages import (AGGREGATOR, KeyAdvertisement, MaskedInput, ShareKeys,
                                   SurvivorSignature, UnmaskResponse)
from dpfed.secagg.protocol import AggregatorSession
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.canonical import canonical_bytes, parse_canonical

from aggregator import aggregate
from aggregator.errors import Rejected
from aggregator.round_state import (ADVERTISE, CONFIRM_STEP, CONSENT, DONE, FITTING, KEYS,
                                    RELEASE,
                                    RELEASE_STEP, SECURE_STEPS, SHARE_KEYS, STEP_NOTICE,
                                    STEP_STATE, STEP_WEIGHT, UNMASK, UNMASK_STEP, LiveRound)

log = logging.getLogger(__name__)

# The secagg message each SendPhase phase must carry.
PHASE_MESSAGE_TYPES = {ADVERTISE: KeyAdvertisement, SHARE_KEYS: ShareKeys,
                       CONFIRM_STEP: SurvivorSignature, UNMASK_STEP: UnmaskResponse}
SECURE_STATES = (KEYS, RELEASE, UNMASK)


def rejected(exc: secagg_errors.SecAggError) -> Rejected:
    """The gRPC status of a refusal of the secagg core (a refused message changes nothing)."""
    if isinstance(exc, secagg_errors.WrongRound):
        code = "INVALID_ARGUMENT"
    elif isinstance(exc, secagg_errors.ReplayedMessage):
        code = "ALREADY_EXISTS"
    elif isinstance(exc, secagg_errors.ForgedMessage):
        code = "UNAUTHENTICATED"
    elif isinstance(exc, secagg_errors.UnknownSender):
        code = "PERMISSION_DENIED"
    elif isinstance(exc, (secagg_errors.OutOfPhase, secagg_errors.AbortedRound)):
        code = "FAILED_PRECONDITION"
    else:
        code = "INVALID_ARGUMENT"
    return Rejected(code, f"secure aggregation: {type(exc).__name__}: {exc}")


class SecureSteps:
    """Mixed into aggregator.rounds.RoundManager (uses its lock, store, registry, clock)."""

    # ---- building the session ----
    def _identity_keys(self, sites) -> dict:
        unknown = [s for s in sites if s not in self.registry.sites]
        if unknown:
            raise secure_round.SecureRoundError(f"invited site(s) {', '.join(unknown[:5])} "
                                                f"are not registered at the aggregator")
        return {s: self.registry.sites[s].public_key for s in sites}

    def _signing_problem(self, spec) -> str:
        """Why this aggregator cannot sign the secagg messages of secure ``spec`` with the key
        the spec pins ("" if it can, or if the spec pins none: dpfed.secure_round.
        secure_problems refuses that)."""
        if self.signing_key is None:
            return ("this aggregator has no signing key (signing_key in aggregator.toml): it "
                    "signs every secure-aggregation message it sends, and the sites refuse "
                    "unsigned ones, so it runs no secure round")
        if spec.aggregator_key_id and spec.aggregator_key_id != self.signing_key.key_id:
            return (f"aggregator_key_id names key {spec.aggregator_key_id}, but this aggregator "
                    f"signs with key {self.signing_key.key_id} (signing_key in "
                    f"aggregator.toml): the sites would refuse every message it sends")
        return ""

    def _new_session(self, live: LiveRound, participants, *, signing: bool = True):
        """(SecureRound, AggregatorSession) for ``participants``, signing with the
        aggregator's identity key; SecureRoundError if infeasible (too few for T + c or the
        quorum, a grid that would overflow, no signing key or not the one the spec pins).
        ``signing`` False: a session rebuilt only to compute a finished round's sum, which
        sends nothing, so it needs no key."""
        problem = self._signing_problem(live.spec) or (
            "" if live.spec.aggregator_key_id else
            "the spec pins no aggregator key (aggregator_key_id): the sites cannot check the "
            "aggregator's signatures")
        if problem and signing:
            raise secure_round.SecureRoundError(problem)
        secure = secure_round.build(live.spec, participants)
        return secure, AggregatorSession(secure.config, self._identity_keys(secure.sites),
                                         signing_key=self.signing_key)

    def _step_deadline(self, live: LiveRound, step: str, now: int) -> int:
        """When ``step`` ends: its weight's share of the time left to the round's deadline,
        shared with the steps after it (advertise 1, share_keys 1, release 2, confirm 1,
        unmask 1)."""
        remaining = max(0, live.stored.deadline_ms - now)
        rest = SECURE_STEPS[SECURE_STEPS.index(step):]
        return now + remaining * STEP_WEIGHT[step] // sum(STEP_WEIGHT[s] for s in rest)

    # ---- consent -> KEYS ----
    def _start_keys(self, live: LiveRound, consented: list[str], why: str) -> None:
        """Under the lock: consent ended with ``consented``; build the session and go to KEYS
        (step advertise), or fail (nobody has drawn or debited anything yet)."""
        try:
            secure, session = self._new_session(live, consented)
        except secure_round.SecureRoundError as exc:
            self._fail(live, f"consent phase ended ({why}) with {len(consented)} consent(s): "
                             f"{exc}; no site released"
                       + (f"; refused: {', '.join(sorted(live.refusals))}"
                          if live.refusals else ""))
            return
        live.secure, live.session = secure, session
        live.participants = frozenset(consented)
        live.stored.participants = list(consented)
        log.info("round %s: consent ended (%s): %d participant(s) agree keys (k = %d, t = %d, "
                 "T = %d, at least %d releases)", live.stored.round_id, why, len(consented),
                 secure.config.degree, secure.config.threshold,
                 secure.config.noise_threshold, secure.floor)
        self._enter_step(live, ADVERTISE, participants=consented)

    def _enter_step(self, live: LiveRound, step: str, *, participants=None,
                    message: str = "") -> None:
        """Under the lock: the step change durably (state, step, its deadline), then in
        memory; wake the sites the step waits for and arm its timer."""
        now = self.now_ms()
        state = STEP_STATE[step]
        due = self._step_deadline(live, step, now)
        if live.state != state:
            live.enter_phase(state, now)
        self.store.set_state(live.stored.round_id, state, message, participants=participants,
                             phases=live.stored.phases, secure_step=step,
                             phase_deadline_ms=due)
        live.stored.state, live.stored.message = state, message
        live.stored.secure_step, live.stored.phase_deadline_ms = step, due
        self._load_step(live)
        if live.timer:
            live.timer.cancel()
        self._notify(live.expected(), live.stored.round_id)
        self._arm_deadline(live.stored.round_id)

    @staticmethod
    def _load_step(live: LiveRound) -> None:
        """Fresh per-step bookkeeping and the step's per-site outputs from the session."""
        live.answers, live.pending, live.notices = {}, {}, {}
        live.deadline_due = False
        live.outputs = {s: m.to_bytes() for s, m in live.session.outputs().items()}

    # ---- what a site is pushed ----
    def _secure_notice(self, live: LiveRound, site: str) -> pb.SignedEnvelope | None:
        """Under the lock: the current step's notice for ``site``, if the step waits for it."""
        step = live.step
        if (not step or site in live.refusals or site not in live.expected()
                or site in live.answers or site in live.pending):
            return None
        if step == RELEASE_STEP and (site in live.contributions or site in live.storing):
            return None
        envelope = live.notices.get(site)
        if envelope is None:
            if step == ADVERTISE:
                # Every participant's key: a site verifies survivors' signatures on the
                # survivor set, any participant's; and, under the secagg sender id of the
                # aggregator, the key that signs every later notice body (encoded once per
                # step; a site checks it against the spec's aggregator_key_id).
                if live.keys_body is None:
                    live.keys_body = secure_round.encode_keys(
                        {**self._identity_keys(sorted(live.participants)),
                         AGGREGATOR: self.signing_key.public_key})
                body = live.keys_body
            else:
                body = live.outputs.get(site)
                if body is None:
                    return None
            # The signed spec travels with the "keys" notice only; later steps name its
            # digest (the site keeps the spec it verified with the round's state).
            notice = pb.PhaseNotice(
                round_id=live.stored.round_id, phase=STEP_NOTICE[step],
                spec_envelope=live.stored.spec_envelope if step == ADVERTISE else b"",
                spec_digest=live.stored.spec_digest,
                participants=sorted(live.participants) if step == ADVERTISE else [],
                deadline_unix_ms=live.stored.phase_deadline_ms, body=body)
            envelope = pb.SignedEnvelope(payload=canonical_bytes(notice),
                                         payload_type="dpfed.v1.PhaseNotice")
            live.notices[site] = envelope
        return envelope

    # ---- a site's message of the key or unmasking step ----
    def _check_secagg(self, live: LiveRound, body: bytes, site: str, cls):
        """Under the lock: the secagg message in ``body`` if the session would accept it from
        ``site`` now (nothing recorded), else Rejected."""
        try:
            msg = live.session.check(body)
        except secagg_errors.SecAggError as exc:
            raise rejected(exc) from None
        if not isinstance(msg, cls):
            raise Rejected("INVALID_ARGUMENT", f"expected a {cls.__name__}, got a "
                                               f"{type(msg).__name__}")
        if msg.sender != site:
            raise Rejected("PERMISSION_DENIED", f"the {cls.__name__} is from {msg.sender!r}, the "
                                                f"envelope from {site!r}")
        return msg

    def secure_phase(self, m: pb.PhaseMessage, envelope: pb.SignedEnvelope,
                      live: LiveRound) -> pb.Ack:
        """A signed PhaseMessage of step advertise, share_keys or unmask: checked (round,
        step, sender, freshness, nonce, the secagg core's checks), stored with its nonce
        (group commit, outside the lock), then counted; the step ends when it was the last."""
        step, site, rid = m.phase, m.site_id, m.round_id
        with self._lock:
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
            if site in live.refusals:
                raise Rejected("ALREADY_EXISTS", f"site {site!r} refused round {rid!r}")
            if site in live.answers:
                raise Rejected("ALREADY_EXISTS", f"site {site!r} already sent its {step} message "
                                                 f"for round {rid!r}")
            if site in live.pending:
                raise Rejected("UNAVAILABLE", f"the {step} message of site {site!r} is being "
                                              f"stored; retry")
            if site not in live.expected():
                raise Rejected("FAILED_PRECONDITION", f"site {site!r} is not in the {step} step "
                                                      f"of round {rid!r} (it missed an earlier "
                                                      f"step)")
            self.auth.check_fresh(m.timestamp_unix_ms, "PhaseMessage")
            msg = self._check_secagg(live, m.body, site, PHASE_MESSAGE_TYPES[step])
            self.auth.take_nonce(envelope.key_id, m.nonce, m.timestamp_unix_ms, "PhaseMessage",
                             persist=False)
            self.auth.nonces.add((envelope.key_id, m.nonce))
            live.pending[site] = msg
        now = self.now_ms()
        try:
            self.store.insert_phase_message_later(
                rid, site, step, envelope.SerializeToString(), now, envelope.key_id, m.nonce,
                m.timestamp_unix_ms).result()
        except Exception as exc:  # noqa: BLE001 - not stored: free the slot, say so
            with self._lock:
                live.pending.pop(site, None)
                self.auth.nonces.discard((envelope.key_id, m.nonce))
                self._close_if_due(live)
            raise Rejected("UNAVAILABLE", f"the aggregator could not store the {step} message "
                                          f"({type(exc).__name__}: {exc}); retry") from None
        with self._lock:
            live.pending.pop(site, None)
            if live.step != step:   # the round failed meanwhile: stored, not counted
                return pb.Ack(message=f"{step} stored; round {rid!r} is {live.state}")
            live.session.record(msg)
            live.answers[site] = now
            log.debug("round %s: %s of %s recorded (%d of %d)", rid, step, site,
                      len(live.answers), len(live.expected()))
            self._close_if_due(live)
        return pb.Ack(message=f"{step} recorded")

    # ---- a masked release ----
    def _check_masked(self, c: pb.Contribution, live: LiveRound) -> None:
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
                                                  f"match round {rid!r}")
        if site in live.contributions:
            raise Rejected("ALREADY_EXISTS", f"site {site!r} already contributed a different "
                                             f"release to round {rid!r}")
        if site in live.storing:
            raise Rejected("UNAVAILABLE", f"a contribution of site {site!r} to round {rid!r} "
                                          f"is being stored; retry")
        if site in live.refusals:
            raise Rejected("ALREADY_EXISTS", f"site {site!r} refused round {rid!r}")
        if site not in live.expected():
            raise Rejected("FAILED_PRECONDITION", f"site {site!r} did not complete key "
                                                  f"agreement in round {rid!r}: it must not "
                                                  f"release")
        self.auth.check_fresh(c.timestamp_unix_ms, "Contribution")

    def _admit_masked(self, c: pb.Contribution, envelope: pb.SignedEnvelope, live: LiveRound):
        """admit_contribution for a secure round: the masked input is checked by the secagg
        core (nothing recorded) and holds the site's slot until stored; it is never decoded
        as statistics."""
        from aggregator.round_state import AcceptedContribution, Admission

        site = c.site_id
        with self._lock:
            previous = live.contributions.get(site)
        if previous is not None and c.masked and (
                previous.payload == envelope.payload
                or (previous.masked == c.masked and previous.epsilon == c.epsilon_spent)):
            # The same masked release, or the site's re-signing of it (fresh timestamp and
            # nonce over the same stored bytes): a duplicate, nothing new.
            return Admission(live, c, envelope, previous, reply=pb.ContributeReply(
                round_id=c.round_id, accepted=True, duplicate=True,
                message="identical contribution already accepted"))
        if not secure_round.is_secure(live.spec):
            raise Rejected("INVALID_ARGUMENT", f"round {c.round_id!r} is not a secure round: "
                                               f"it takes no masked release")
        self._check_masked(c, live)
        if not c.masked or c.statistics or c.n:
            raise Rejected("INVALID_ARGUMENT", f"round {c.round_id!r} is a secure round: a "
                                               f"contribution carries its masked input in "
                                               f"`masked`, with empty statistics and n = 0")
        if c.epsilon_spent != live.spec.epsilon:
            raise Rejected("INVALID_ARGUMENT", f"epsilon_spent {c.epsilon_spent} differs from the "
                                               f"round's epsilon {live.spec.epsilon}")
        expected = live.secure.share_noise()
        declared = self._declared_noise(c, expected)
        if declared != expected:
            raise Rejected("INVALID_ARGUMENT",
                           f"noise description ({declared.summary()}) differs from the share "
                           f"of round {c.round_id!r} ({expected.summary()})")
        accepted = AcceptedContribution(envelope.payload, envelope.signature, b"", 0,
                                        c.epsilon_spent, self.now_ms(), declared,
                                        masked=c.masked)
        with self._lock:
            self._check_masked(c, live)
            msg = self._check_secagg(live, c.masked, site, MaskedInput)
            self.auth.take_nonce(envelope.key_id, c.nonce, c.timestamp_unix_ms, "Contribution",
                             persist=False)
            beyond = self.budgets.reserve(site, c.epsilon_spent, c.round_id)
            if beyond:
                raise Rejected("FAILED_PRECONDITION", beyond)
            live.storing[site] = accepted
            self.auth.nonces.add((envelope.key_id, c.nonce))
        return Admission(live, c, envelope, accepted, secagg=msg)

    # ---- ending steps ----
    def _secure_close_if_due(self, live: LiveRound) -> None:
        """Under the lock, once nothing is being stored: end the current step when every
        site it waits for answered, or its deadline passed; in unmask, finish as soon as
        every needed secret has its t shares."""
        if live.state not in SECURE_STATES or self._closed or live.pending or live.storing:
            return
        if live.step == UNMASK_STEP and live.session.ready():
            self._finish_secure(live, "every needed share arrived")
        elif not live.missing():
            self._end_step(live, "every site answered")
        elif live.deadline_due:
            self._end_step(live, "its deadline passed")

    def _end_step(self, live: LiveRound, why: str) -> None:
        step, session = live.step, live.session
        missing = live.missing()
        absent = f"; no answer from {', '.join(missing)}" if missing else ""
        if step == UNMASK_STEP:
            self._fail(live, f"unmasking ended ({why}) without the shares that remove the "
                             f"masks{absent}; the masked releases stay masked")
            return
        try:
            if step == ADVERTISE:
                session.close_advertisements()
                nxt = SHARE_KEYS
            elif step == SHARE_KEYS:
                session.close_share_keys()
                nxt = RELEASE_STEP
            elif step == RELEASE_STEP:
                session.close_masked_inputs()
                nxt = CONFIRM_STEP
            else:
                session.close_consistency()
                nxt = UNMASK_STEP
        except secagg_errors.SecAggError as exc:
            released = len(live.contributions)
            self._fail(live, f"{step} step ended ({why}): {exc}{absent}"
                             + (f"; {released} site(s) released and are accounted for"
                                if released else "; no site released"))
            return
        log.info("round %s: %s step ended (%s)%s", live.stored.round_id, step, why, absent)
        self._enter_step(live, nxt)

    def _finish_secure(self, live: LiveRound, why: str) -> None:
        try:
            self._unmask(live)
        except secagg_errors.TooFewSurvivors:
            return
        except secagg_errors.SecAggError as exc:
            self._fail(live, f"unmasking failed: {type(exc).__name__}: {exc}")
            return
        result = live.session.result
        dropped = sorted(set(live.participants) - set(result.included))
        self._close_for_fit(live, f"unmasked the sum of {len(result.included)} masked "
                                  f"release(s) ({why}); dropped: "
                                  f"{', '.join(dropped) or 'none'}")

    def _unmask(self, live: LiveRound) -> None:
        """finish() the session and keep the decoded sum as the round's running total (n
        clamped at 0: post-processing). A sum that may have wrapped modulo 2^64 (more rows
        than the grid holds) raises SumOutOfRange: the round fails with its message."""
        result = live.session.finish()
        upper, n = live.secure.decode_sum(result.vector)
        running = aggregate.RunningTotal(live.stored.dim)
        running.add_rows(upper[None, :], max(0, int(round(n))))
        live.running = running

    # ---- restart ----
    def _replay(self, live: LiveRound, *, finish: bool = False) -> None:
        """Rebuild the session of a secure round from the store: the key messages, the
        masked releases (already in ``live.contributions``) and the unmask answers, fed
        through the steps up to the stored one; with ``finish`` the sum too."""
        stored = live.stored
        step = stored.secure_step or ADVERTISE
        live.secure, live.session = self._new_session(live, stored.participants,
                                                      signing=not finish)
        live.participants = frozenset(stored.participants)
        session = live.session
        upto = SECURE_STEPS.index(step)
        answers = {}

        def feed(phase: str) -> None:
            for site, blob, received_ms in self.store.phase_messages(stored.round_id, phase):
                env = pb.SignedEnvelope.FromString(blob)
                session.receive(parse_canonical(env.payload, "dpfed.v1.PhaseMessage").body)
                if phase == step:
                    answers[site] = received_ms

        feed(ADVERTISE)
        if upto >= 1:
            session.close_advertisements()
            feed(SHARE_KEYS)
        if upto >= 2:
            session.close_share_keys()
            for site in sorted(live.contributions):
                session.receive(live.contributions[site].masked)
        if upto >= 3:
            session.close_masked_inputs()
            feed(CONFIRM_STEP)
        if upto >= 4:
            session.close_consistency()
            feed(UNMASK_STEP)
        self._load_step(live)
        live.answers = answers
        if finish:
            self._unmask(live)

    def _recover_secure(self, live: LiveRound) -> None:
        """After a restart, under the lock: rebuild an open secure round's session (a round
        that cannot be rebuilt fails, saying why)."""
        if live.stored.state not in (KEYS, RELEASE, UNMASK, FITTING):
            return
        try:
            self._replay(live, finish=live.stored.state == FITTING)
        except Exception as exc:  # noqa: BLE001 - a round that cannot be rebuilt fails visibly
            log.exception("round %s: secure-aggregation state not rebuilt", live.stored.round_id)
            self._fail(live, f"the secure-aggregation state could not be rebuilt after a "
                             f"restart: {type(exc).__name__}: {exc}")
            return
        log.info("round %s: secure-aggregation state rebuilt after restart (%s, %d answer(s) "
                 "in this step, %d masked release(s))", live.stored.round_id,
                 live.stored.secure_step, len(live.answers), len(live.contributions))

    def _secure_total(self, live: LiveRound):
        """The decoded sum of a finished secure round (rebuilt from the store if needed)."""
        if live.running is None:
            if live.stored.state != DONE:
                raise Rejected("FAILED_PRECONDITION", f"round {live.stored.round_id!r} has no "
                                                      f"unmasked sum ({live.stored.state})")
            self._replay(live, finish=True)
        return live.running


__all__ = ["SecureSteps", "rejected", "PHASE_MESSAGE_TYPES", "SECURE_STATES"]
