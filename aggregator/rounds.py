"""The life of a round at the aggregator, as plain methods the gRPC servicer adapts.

Phases (docs/protocol.md; states in aggregator.round_state):

* CONSENT: the signed spec is pushed to every invited site; each checks the spec, its
  policy, its budget and its data and answers with a signed consent (SendPhase) or a
  refusal. Nothing is drawn and nothing is debited, so a refusal here costs nobody anything.
  The phase ends when every invited site answered or at the consent deadline; the round goes
  on only if at least ``quorum`` sites consented, and those are its participants.
* RELEASE: a notice is pushed to each participant, which releases (draws the noise, debits
  and stores the release in one ledger transaction) and sends it. Only participants may
  contribute, and every participant's release is taken: none is turned away because others
  were faster. The phase ends when every participant answered, or at the deadline (then a
  participant that never answered is listed as dropped).
* FITTING -> DONE, or FAILED (with a message) at any point before DONE.
* Secure rounds (spec.aggregation = "secure") agree keys (KEYS) between CONSENT and RELEASE,
  release masked inputs in RELEASE and unmask the sum (UNMASK) before FITTING: the steps are
  in aggregator.secure_rounds (SecureSteps, mixed in here).

Who sent a message and whether it is fresh is aggregator.authentication's; the sites' open
streams are aggregator.subscribers'; what arrives on the wire is checked by
aggregator.contribution_wire, and a closed round is fitted by aggregator.fitting.

Every state change is one store transaction first and an in-memory change second, so the
in-memory view never runs ahead of what a restart would reload. Checks are ordered cheapest
first and authentication before anything that reveals round state; nothing that is rejected
reaches the store or a round's answers.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from dpfed import noise as dpnoise
from dpfed import secure_round
from dpfed.statistics import Statistics, StatisticsError, encoded_values
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.canonical import CanonicalError, canonical_bytes, digest, parse_canonical
from dpfed.wire.signing import SignatureError, verify
from dpfed.wire import limits

from aggregator import aggregate, identity
from aggregator.authentication import SiteAuthenticator
from aggregator.budget import SiteBudgets
from aggregator.contribution_wire import (check_envelope_size, check_fields, fast_contribution,
                                          parse_envelope)
from aggregator.errors import Rejected
from aggregator.fitting import fit_round
from aggregator.registry import Registry
from aggregator.round_state import (COLLECTING, CONSENT, DONE, FAILED, FITTING, KEYS, OPEN,
                                    RELEASE, STATE_TO_PB, UNMASK, AcceptedContribution,
                                    Admission, LiveRound, round_expected_noise, stored_noise,
                                    sum_noise, with_public)
from aggregator.secure_rounds import SecureSteps
from aggregator.subscribers import Subscribers
from aggregator.store import RoundStore, StoredRound

log = logging.getLogger(__name__)

__all__ = ["Rejected", "RoundManager", "round_expected_noise", "consent_deadline_ms"]

# Default length of the consent phase: a third of the time to the deadline, within these.
MIN_CONSENT_MS, MAX_CONSENT_MS = 5_000, 120_000
# ListRounds: rows per page by default and at most.
DEFAULT_LIST_ROUNDS, MAX_LIST_ROUNDS = 100, 1000


def consent_deadline_ms(spec: pb.RoundSpec, started_ms: int) -> int:
    """When the consent phase of ``spec`` ends: the spec's consent_deadline_unix_ms, or a third
    of the time to the deadline (at least 5 s, at most 120 s), never after the deadline."""
    if spec.consent_deadline_unix_ms:
        return spec.consent_deadline_unix_ms
    span = (spec.deadline_unix_ms - started_ms) // 3
    return min(spec.deadline_unix_ms, started_ms + max(MIN_CONSENT_MS, min(MAX_CONSENT_MS, span)))


@functools.lru_cache(maxsize=64)
def _noise_of(wire: bytes) -> dpnoise.NoiseDescription:
    """The NoiseDescription of a declared noise message's wire bytes; cached (every site of a
    round declares the same few terms, and building one costs ~20 us a contribution). A
    malformed one raises NoiseError, which is not cached."""
    return dpnoise.from_proto(pb.NoiseDescription.FromString(wire))


class RoundManager(SecureSteps):
    def __init__(self, store: RoundStore, registry: Registry, *, max_clock_skew_s: float = 300.0,
                 skip_fit: bool = False, clock=time.time, signing_key=None):
        self.store = store
        self.registry = registry
        # The aggregator's identity key (dpfed.wire.signing.SigningKey, aggregator.toml
        # signing_key): signs every secure-aggregation message it sends. None: secure rounds
        # are refused at StartRound (aggregator.secure_rounds).
        self.signing_key = signing_key
        self.max_clock_skew_ms = int(max_clock_skew_s * 1000)
        self.skip_fit = skip_fit
        self.clock = clock
        self._lock = threading.RLock()
        self._rounds: dict[str, LiveRound] = {}
        # Signature, identity, freshness and replay checks (aggregator.authentication).
        self.auth = SiteAuthenticator(registry, store, max_clock_skew_ms=self.max_clock_skew_ms,
                                      now_ms=self.now_ms, lock=self._lock)
        # The sites' open round streams (aggregator.subscribers).
        self.subscribers = Subscribers(self._lock)
        # One fit at a time: PyMC is CPU-bound and the machine small; rounds queue up.
        self._fit_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fit")
        self._closed = False
        # Each site's recorded spend, declared total and trusted coordinators (aggregator.budget).
        self.budgets = SiteBudgets(store)

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # ---- start-up and shutdown ----
    def recover(self) -> None:
        """Reload every round from the store; restart deadline timers of open rounds and re-fit
        rounds whose fit was interrupted."""
        self.auth.load()
        refit, reopen = [], []
        counts = self.store.contribution_counts()
        with self._lock:
            for stored in self.store.rounds():
                env = parse_envelope(stored.spec_envelope)
                spec = parse_canonical(env.payload, "dpfed.v1.RoundSpec")
                if stored.state == OPEN:   # stored before phases: every invited site releases
                    stored.state, stored.participants = RELEASE, list(stored.invited)
                live = LiveRound(stored, spec, env, frozenset(stored.invited))
                live.consents = self.store.consents(stored.round_id)
                if stored.participants is not None:
                    live.participants = frozenset(stored.participants)
                secure = secure_round.is_secure(spec)
                if stored.state in (CONSENT, KEYS, RELEASE, UNMASK, FITTING):
                    stored_contributions = self._load_contributions(live)
                    if not secure:   # a secure round's sum is the unmasked one (_replay)
                        live.running = aggregate.RunningTotal(stored.dim)
                    if stored_contributions and not secure:
                        live.running.add_rows(
                            np.stack([encoded_values(c.statistics) for c in stored_contributions]),
                            sum(c.n for c in stored_contributions))
                else:   # DONE or FAILED: read from the store when asked (status)
                    live.archived = counts.get(stored.round_id, 0)
                live.refusals = dict(self.store.refusals(stored.round_id))
                live.refusal_epsilons = self.store.refusal_epsilons(stored.round_id)
                if secure:
                    self._recover_secure(live)
                self._rounds[stored.round_id] = live
                if stored.state in COLLECTING:
                    reopen.append(stored.round_id)
                elif stored.state == FITTING:
                    refit.append(stored.round_id)
        for rid in reopen:
            live = self._rounds[rid]
            log.info("round %s: reopened after restart in %s with %d consent(s), %d "
                     "contribution(s)", rid, live.state, len(live.consents),
                     len(live.contributions))
            self._arm_deadline(rid)
        for rid in refit:
            log.info("round %s: fit was interrupted by a restart, fitting again", rid)
            self._submit_fit(rid)

    def _load_contributions(self, live: LiveRound):
        """The stored contributions of ``live`` into ``live.contributions``; returns them."""
        stored_contributions = self.store.contributions(live.stored.round_id)
        for c in stored_contributions:
            env_c = parse_envelope(c.envelope)
            msg = fast_contribution(env_c.payload) or parse_canonical(env_c.payload,
                                                                      "dpfed.v1.Contribution")
            live.contributions[c.site_id] = AcceptedContribution(
                env_c.payload, env_c.signature, c.statistics, c.n, c.epsilon, c.received_ms,
                dpnoise.from_proto(msg.noise) if msg.HasField("noise") else None,
                masked=msg.masked)
        return stored_contributions

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for live in self._rounds.values():
                if live.timer:
                    live.timer.cancel()
        self.subscribers.close()
        self._fit_pool.shutdown(wait=False, cancel_futures=True)

    def _round(self, round_id: str) -> LiveRound:
        live = self._rounds.get(round_id)
        if live is None:
            raise Rejected("FAILED_PRECONDITION", f"unknown round {round_id!r}")
        return live

    # ---- coordinator side ----
    def start_round(self, envelope: pb.SignedEnvelope,
                    peer: identity.PeerIdentity | None = None) -> pb.RoundStatus:
        check_envelope_size(envelope)
        try:
            spec = verify(envelope, self.registry.coordinator_keys, "dpfed.v1.RoundSpec")
        except SignatureError as exc:
            raise Rejected("UNAUTHENTICATED", str(exc)) from None
        except CanonicalError as exc:
            raise Rejected("INVALID_ARGUMENT", str(exc)) from None
        owner = self.registry.coordinator_of_key(envelope.key_id)
        if spec.coordinator_id != owner:
            raise Rejected("PERMISSION_DENIED", f"spec names coordinator {spec.coordinator_id!r} "
                                                f"but is signed by the key of {owner!r}")
        mismatch = identity.coordinator_mismatch(peer, spec.coordinator_id)
        if mismatch:
            raise Rejected("PERMISSION_DENIED", mismatch)
        problems = limits.spec_problems(spec)
        if not problems:  # validate_spec decodes public statistics: only once they fit
            problems = aggregate.validate_spec(spec, self.registry.site_ids())
        now = self.now_ms()
        if spec.deadline_unix_ms and spec.deadline_unix_ms <= now:
            problems.append("deadline_unix_ms is in the past")
        if spec.consent_deadline_unix_ms and spec.consent_deadline_unix_ms <= now:
            problems.append("consent_deadline_unix_ms is in the past")
        if not problems:
            try:  # what every contribution must declare; also refuses degenerate scales
                expected = round_expected_noise(spec)
            except ValueError as exc:
                problems.append(str(exc))
        invited = sorted(spec.sites) if spec.sites else self.registry.site_ids()
        if secure_round.is_secure(spec):
            unsigned = self._signing_problem(spec)
            if unsigned and self.signing_key is None:
                raise Rejected("FAILED_PRECONDITION", f"round {spec.round_id!r} refused: "
                                                      f"{unsigned}")
            if unsigned:
                problems.append(unsigned)
        if not problems and secure_round.is_secure(spec) and spec.site_key_ids:
            # The coordinator's anchor of the identity keys relayed to the sites: it must name
            # the keys this aggregator has registered.
            for site in invited:
                kid = spec.site_key_ids.get(site)
                record = self.registry.sites.get(site)
                if kid is None:
                    problems.append(f"site_key_ids names no key for invited site {site}")
                elif record is not None and kid != record.key_id:
                    problems.append(f"site_key_ids names key {kid} for site {site}, which is "
                                    f"registered with key {record.key_id}")
        if problems:
            raise Rejected("INVALID_ARGUMENT", "invalid round spec: " + "; ".join(problems))
        stored = StoredRound(spec.round_id, envelope.SerializeToString(), digest(envelope.payload),
                             len(spec.feature_names), spec.quorum, spec.deadline_unix_ms, invited,
                             CONSENT, "", now, 0.0, 0.0, None, [[CONSENT, now, 0.0]])
        with self._lock:
            if spec.round_id in self._rounds:
                raise Rejected("ALREADY_EXISTS", f"round {spec.round_id!r} already exists")
            self.store.insert_round(stored)
            self._rounds[spec.round_id] = LiveRound(
                stored, spec, envelope, frozenset(invited),
                running=(None if secure_round.is_secure(spec)
                         else aggregate.RunningTotal(len(spec.feature_names))),
                expected_noise=expected)
            self.subscribers.notify(invited, spec.round_id)
        log.info("round %s: started by %s, d=%d, eps=%g, %s, quorum %d of %d invited site(s), "
                 "consent within %.0f s, deadline in %.0f s", spec.round_id, owner,
                 len(spec.feature_names), spec.epsilon, secure_round.describe(spec),
                 spec.quorum, len(invited),
                 (consent_deadline_ms(spec, now) - now) / 1000, (spec.deadline_unix_ms - now) / 1000)
        self._arm_deadline(spec.round_id)
        return self.status(spec.round_id)

    def _reader(self, peer: identity.PeerIdentity | None) -> tuple[str | None, str | None]:
        """(reader, its key id) for the visibility rules (aggregator.budget.SiteBudgets.hidden):
        (None, None) without TLS; a peer that is not a coordinator reads as trusted by no-one."""
        if peer is None:
            return None, None
        if peer.kind != identity.COORDINATOR:
            return str(peer), None
        return peer.party_id, self.registry.key_of_coordinator(peer.party_id)

    def status(self, round_id: str, peer: identity.PeerIdentity | None = None) -> pb.RoundStatus:
        """The round's status as ``peer`` may see it: the n, epsilon and refusal reason of a
        site that does not trust the reading coordinator are hidden (aggregator.budget)."""
        check_fields(limits.check_round_query, round_id)
        reader, reader_kid = self._reader(peer)
        with self._lock:
            live = self._rounds.get(round_id)
            if live is None:
                raise Rejected("NOT_FOUND", f"unknown round {round_id!r}")
            s = live.stored
            contributions = sorted(live.contributions.items())
            if live.archived is not None:   # a finished round loaded from the store
                contributions = [(site, AcceptedContribution(b"", b"", b"", n, eps, ms))
                                 for site, n, eps, ms in self.store.contribution_rows(round_id)]
            refusals = sorted(live.refusals.items())
            spec = pb.RoundSpec()
            spec.CopyFrom(live.spec)
            spec.ClearField("public_statistics")
            status = pb.RoundStatus(
                round_id=round_id, state=STATE_TO_PB[s.state], quorum=s.quorum,
                deadline_unix_ms=s.deadline_ms, message=s.message, spec_digest=s.spec_digest,
                round_seconds=s.round_s, fit_seconds=s.fit_s, missing_sites=live.missing(),
                consented=sorted(live.consents),
                dropped=live.dropped([site for site, _ in contributions]),
                started_unix_ms=s.started_ms,
                phases=[pb.PhaseTime(phase=p, started_unix_ms=t, seconds=sec)
                        for p, t, sec in s.phases],
                spec=spec, invited=sorted(live.invited))
            refusal_eps = dict(live.refusal_epsilons)
        starter = live.spec.coordinator_id
        for k, c in contributions:
            hidden = self.budgets.hidden(k, reader, reader_kid, starter)
            status.contributions.append(
                pb.SiteContribution(site_id=k, hidden=hidden) if hidden else
                pb.SiteContribution(site_id=k, n=c.n, epsilon_spent=c.epsilon,
                                    received_unix_ms=c.received_ms))
        for k, r in refusals:
            hidden = self.budgets.hidden(k, reader, reader_kid, starter)
            status.refusals.append(
                pb.SiteRefusalInfo(site_id=k, hidden=hidden) if hidden else
                pb.SiteRefusalInfo(site_id=k, reason=r, epsilon_spent=refusal_eps.get(k, 0.0)))
        return status

    def result(self, round_id: str, peer: identity.PeerIdentity | None = None) -> pb.RoundResult:
        """The round's result as ``peer`` may see it. The posterior is shown to the round's
        own coordinator (every contributing site trusted it: it answered its signed spec) and
        to any coordinator every contributing site trusts; another coordinator gets
        PERMISSION_DENIED. Per-site rows of a site that (no longer) trusts the reader are
        hidden, and then n_total too (it would give the hidden n by subtraction)."""
        status = self.status(round_id)
        if status.state != pb.RoundStatus.DONE:
            state = pb.RoundStatus.State.Name(status.state)
            raise Rejected("FAILED_PRECONDITION", f"round {round_id!r} has no result: it is "
                                                  f"{state}{': ' + status.message if status.message else ''}")
        res = self.store.get_result(round_id)
        summary_json = res.summary_json
        reader, reader_kid = self._reader(peer)
        if reader is not None:
            starter = self._rounds[round_id].spec.coordinator_id
            hidden = {c.site_id: self.budgets.hidden(c.site_id, reader, reader_kid, starter)
                      for c in status.contributions}
            hidden = {k: v for k, v in hidden.items() if v}
            if hidden and reader != starter:
                raise Rejected("PERMISSION_DENIED",
                               f"the result of round {round_id!r} is post-processing of the "
                               f"releases of site(s) {', '.join(sorted(hidden))}, which do not "
                               f"trust coordinator {reader!r}")
            if hidden:
                summary = json.loads(summary_json)
                summary["sites"] = [{"site_id": r["site_id"], "hidden": hidden[r["site_id"]]}
                                    if r.get("site_id") in hidden else r
                                    for r in summary.get("sites", [])]
                summary["n_total"] = None
                summary_json = json.dumps(summary, sort_keys=True)
        return pb.RoundResult(round_id=round_id, summary_json=summary_json,
                              beta_draws=res.beta_draws, draws=res.draws, dim=res.dim)

    def list_sites(self, peer: identity.PeerIdentity | None = None) -> pb.ListSitesReply:
        """Every registered site; its details (key, connection, spend, declared total) only
        to a coordinator it trusts: others get the site id (membership) and why."""
        reader, reader_kid = self._reader(peer)
        reply = pb.ListSitesReply()
        for r in self.registry.snapshot():
            hidden = self.budgets.hidden(r.site_id, reader, reader_kid)
            if hidden:
                reply.sites.append(pb.SiteInfo(site_id=r.site_id, hidden=hidden))
                continue
            b = self.budgets.view(r.site_id)
            reply.sites.append(pb.SiteInfo(
                site_id=r.site_id, key_id=r.key_id, connected=r.connected_streams > 0,
                last_seen_unix_ms=r.last_seen_unix_ms, spent_epsilon=b.spent,
                declared_total_epsilon=b.declared_total, rounds=b.rounds))
        return reply

    def site_spending(self, site_id: str,
                      peer: identity.PeerIdentity | None = None) -> pb.SiteSpending:
        """``site_id``'s spending round by round as recorded here (GetSiteSpending); only
        to a coordinator the site trusts (the rules of ``list_sites``)."""
        check_fields(limits.check_site_query, site_id)
        if site_id not in self.registry.sites:
            raise Rejected("NOT_FOUND", f"unknown site {site_id!r}")
        reader, reader_kid = self._reader(peer)
        hidden = self.budgets.hidden(site_id, reader, reader_kid)
        if hidden:
            return pb.SiteSpending(site_id=site_id, hidden=hidden)
        return self.budgets.spending(site_id)

    def list_rounds(self, limit: int = 0, before: str = "") -> pb.ListRoundsReply:
        """One summary line per round, newest first (counts only, no per-site rows: which
        sites answered is in GetRound, under its visibility rules). ``before``: a round id;
        only rounds started before it (paging)."""
        limit = min(limit or DEFAULT_LIST_ROUNDS, MAX_LIST_ROUNDS)
        if before:
            check_fields(limits.check_round_query, before)
        with self._lock:
            lives = sorted(self._rounds.values(),
                           key=lambda r: (r.stored.started_ms, r.stored.round_id), reverse=True)
            if before:
                anchor = self._rounds.get(before)
                if anchor is None:
                    raise Rejected("NOT_FOUND", f"unknown round {before!r}")
                key = (anchor.stored.started_ms, anchor.stored.round_id)
                lives = [r for r in lives if (r.stored.started_ms, r.stored.round_id) < key]
            reply = pb.ListRoundsReply()
            for live in lives[:limit]:
                s, spec = live.stored, live.spec
                reply.rounds.append(pb.RoundSummary(
                    round_id=s.round_id, state=STATE_TO_PB[s.state],
                    coordinator_id=spec.coordinator_id, target=spec.target,
                    epsilon=spec.epsilon, invited=len(live.invited),
                    consented=len(live.consents),
                    contributed=(len(live.contributions) if live.archived is None
                                 else live.archived),
                    refused=len(live.refusals), quorum=s.quorum, started_unix_ms=s.started_ms,
                    deadline_unix_ms=s.deadline_ms, message=s.message))
        return reply

    # ---- site side ----
    def hello(self, envelope: pb.SignedEnvelope, peer: identity.PeerIdentity | None = None,
              *, declare: bool = True) -> str:
        """Authenticate a SiteHello; returns the site id. ``declare``: record the total budget
        and trusted coordinators it declares (Subscribe; not GetSiteHistory)."""
        hello = self.auth.verify_site(envelope, "dpfed.v1.SiteHello", peer)
        self.auth.check_fresh(hello.timestamp_unix_ms, "SiteHello")
        self.auth.take_nonce(envelope.key_id, hello.nonce, hello.timestamp_unix_ms, "SiteHello")
        if declare:
            self.budgets.declare(hello, envelope, self.now_ms())
        return hello.site_id

    def site_history(self, envelope: pb.SignedEnvelope,
                     peer: identity.PeerIdentity | None = None) -> pb.SiteHistory:
        """The aggregator's record of the spending of the site whose signed SiteHello this is
        (GetSiteHistory): only that site may ask, over its own TLS identity."""
        return self.budgets.history(self.hello(envelope, peer, declare=False))

    def subscribe(self, site_id: str, updates=None) -> tuple[int, object]:
        """Register a round stream of ``site_id`` (aggregator.subscribers: one live stream per
        identity); its queue gets the id of every round that needs the site."""
        token, q = self.subscribers.add(site_id, updates)
        self.registry.mark_connected(site_id, self.now_ms())
        log.info("site %s subscribed", site_id)
        return token, q

    def unsubscribe(self, token: int) -> None:
        site_id = self.subscribers.remove(token)
        if site_id:
            self.registry.mark_disconnected(site_id, self.now_ms())
            log.info("site %s unsubscribed", site_id)

    def message_for_site(self, round_id: str, site_id: str) -> pb.SignedEnvelope | None:
        """What to push to ``site_id`` about ``round_id``, if the current phase waits for it:
        in CONSENT the coordinator-signed spec (the site answers with a consent or a
        refusal), in RELEASE a PhaseNotice naming the participants and carrying that spec (the
        site releases). None when the round needs nothing (more) from the site."""
        with self._lock:
            live = self._rounds.get(round_id)
            if live is None or site_id in live.refusals:
                return None
            if live.secure is not None and live.step:
                return self._secure_notice(live, site_id)
            if live.state == CONSENT:
                if site_id in live.invited and site_id not in live.consents:
                    return live.envelope
                return None
            if (live.state == RELEASE and site_id in live.participants
                    and site_id not in live.contributions and site_id not in live.storing):
                notice = pb.PhaseNotice(round_id=round_id, phase="release",
                                        spec_envelope=live.stored.spec_envelope,
                                        participants=sorted(live.participants),
                                        deadline_unix_ms=live.stored.deadline_ms)
                return pb.SignedEnvelope(payload=canonical_bytes(notice),
                                         payload_type="dpfed.v1.PhaseNotice")
            return None

    def pending_rounds(self, site_id: str) -> list[str]:
        with self._lock:
            return [rid for rid in self._rounds
                    if self.message_for_site(rid, site_id) is not None]

    def _notify(self, sites, round_id: str) -> None:
        """Wake the round streams of ``sites``: each pushes what ``message_for_site`` says."""
        self.subscribers.notify(sites, round_id)

    # ---- consent phase ----
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
        m = self.auth.verify_site(envelope, "dpfed.v1.PhaseMessage", peer)
        return m, self._round(m.round_id)

    def consent_later(self, m: pb.PhaseMessage, envelope: pb.SignedEnvelope,
                      live: LiveRound) -> Future:
        """Phase "consent": the site will release if selected. Checked and its site's slot
        reserved now, under the manager lock (a refusal raises Rejected here); recorded
        durably (with its nonce) by the store's group commit; the returned future holds the
        Ack once durable (or the commit's error), and the consent is counted by the store's
        writer thread then, whether or not anyone waits. Does not block, so the event loop
        calls it directly (a thread hop per consent cost more than the checks: 1000 consents
        took 0.48 s through the executor, docs/benchmarks.md). The consent phase ends early
        once every invited site answered.

        Many sites consent at once: one transaction for all that arrive together. The
        consent deadline does not end the phase while consents are being stored (it is
        carried out when the last one is durable), so a site answered "consent recorded" is
        always a participant."""
        reply: Future = Future()
        with self._lock:
            if m.site_id in live.consents:
                reply.set_result(pb.Ack(message="consent already recorded"))
                return reply
            storing = live.consents_storing.get(m.site_id)
            if storing is None:
                done, received_ms = self._reserve_consent(m, envelope, live)
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
            stored = self.store.insert_consent_later(
                m.round_id, m.site_id, envelope.SerializeToString(), received_ms,
                envelope.key_id, m.nonce, m.timestamp_unix_ms)
        except BaseException as exc:
            self._abandon_consent(m, envelope, live, done, exc)
            raise

        def settle(committed: Future) -> None:
            error = committed.exception()
            if error is not None:
                self._abandon_consent(m, envelope, live, done, error)
                reply.set_exception(error)
                return
            with self._lock:
                del live.consents_storing[m.site_id]
                live.consents[m.site_id] = received_ms
                done.set_result(None)
                log.info("round %s: site %s consented (%d of %d invited)", m.round_id,
                         m.site_id, len(live.consents), len(live.invited))
                try:
                    self._end_consent_if_due(live)
                finally:
                    reply.set_result(pb.Ack(message="consent recorded"))
        stored.add_done_callback(settle)
        return reply

    def _reserve_consent(self, m: pb.PhaseMessage, envelope: pb.SignedEnvelope,
                         live: LiveRound) -> tuple[Future, int]:
        """Under the lock: every check of a consent, then its nonce and its site's slot
        reserved (a concurrent resend waits for its outcome). Returns the slot's future and
        the time of receipt (ms)."""
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
        self.auth.check_fresh(m.timestamp_unix_ms, "PhaseMessage")
        self.auth.take_nonce(envelope.key_id, m.nonce, m.timestamp_unix_ms, "PhaseMessage",
                             persist=False)
        self.auth.nonces.add((envelope.key_id, m.nonce))
        done: Future = Future()
        live.consents_storing[m.site_id] = done
        return done, self.now_ms()

    def _abandon_consent(self, m: pb.PhaseMessage, envelope: pb.SignedEnvelope,
                         live: LiveRound, done: Future, error: BaseException) -> None:
        """The consent's commit failed: free its slot and nonce, tell a waiting resend."""
        with self._lock:
            del live.consents_storing[m.site_id]
            self.auth.nonces.discard((envelope.key_id, m.nonce))
            done.set_exception(error)
            self._end_consent_if_due(live)

    def _end_consent_if_due(self, live: LiveRound) -> None:
        """Under the lock, once no consent is being stored: end the consent phase when every
        invited site answered, or when its deadline passed meanwhile."""
        if live.state != CONSENT or live.consents_storing or self._closed:
            return
        if not live.missing():
            self._end_consent(live, "every invited site answered")
        elif live.deadline_due:
            self._end_consent(live, "consent deadline passed")

    def _end_consent(self, live: LiveRound, why: str) -> None:
        """Under the lock: fix the participants (the consenting sites) and go on to RELEASE,
        or fail if fewer than the quorum consented (nobody has released: nobody paid)."""
        live.deadline_due = False   # the consent deadline's; the next phase arms its own
        consented = sorted(live.consents)
        if secure_round.is_secure(live.spec) and len(consented) >= live.stored.quorum:
            if live.timer:
                live.timer.cancel()
            self._start_keys(live, consented, why)
            return
        if len(consented) < live.stored.quorum:
            self._fail(live, f"consent phase ended ({why}) with {len(consented)} consent(s), "
                             f"fewer than the quorum {live.stored.quorum}; no site released"
                             + (f"; refused: {', '.join(sorted(live.refusals))}"
                                if live.refusals else "")
                             + (f"; no answer: {', '.join(live.missing())}"
                                if live.missing() else ""))
            return
        now = self.now_ms()
        live.enter_phase(RELEASE, now)
        self.store.set_state(live.stored.round_id, RELEASE, "", participants=consented,
                             phases=live.stored.phases)
        live.stored.state, live.stored.message = RELEASE, ""
        live.stored.participants = consented
        live.participants = frozenset(consented)
        if live.timer:
            live.timer.cancel()
        log.info("round %s: consent ended (%s): %d participant(s) release now", live.stored.round_id,
                 why, len(consented))
        self._notify(live.participants, live.stored.round_id)
        self._arm_deadline(live.stored.round_id)

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
            stored = self.store.insert_contribution_later(*admission.row())
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
        c = self.auth.verify_site(envelope, "dpfed.v1.Contribution", peer)
        live = self._round(c.round_id)
        if c.masked or secure_round.is_secure(live.spec):
            return self._admit_masked(c, envelope, live)
        site = c.site_id
        with self._lock:
            previous = live.contributions.get(site)
        if previous is not None and (previous.payload == envelope.payload or (
                previous.statistics == c.statistics and previous.n == c.n
                and previous.epsilon == c.epsilon_spent)):
            # The same release, byte for byte, or re-signed by the site with a fresh
            # timestamp and nonce over the same stored statistics (site_node.node.fresh_envelope):
            # the same noise, so nothing new; answered as a duplicate.
            return Admission(live, c, envelope, previous, reply=pb.ContributeReply(
                round_id=c.round_id, accepted=True, duplicate=True,
                message="identical contribution already accepted"))
        self._check_contribution(c, live, envelope)
        try:
            stats_n = aggregate.encoded_n(c.statistics, live.stored.dim)
        except StatisticsError as exc:
            raise Rejected("INVALID_ARGUMENT", f"invalid statistics: {exc}") from None
        if stats_n != c.n:
            raise Rejected("INVALID_ARGUMENT", f"n = {c.n} differs from the statistics' n = "
                                               f"{stats_n}")
        if c.n < 1:
            raise Rejected("INVALID_ARGUMENT", "n must be at least 1")
        if not (math.isfinite(c.epsilon_spent) and c.epsilon_spent == live.spec.epsilon):
            raise Rejected("INVALID_ARGUMENT", f"epsilon_spent {c.epsilon_spent} differs from the "
                                               f"round's epsilon {live.spec.epsilon}")
        noise = self._check_noise(c, live)
        accepted = AcceptedContribution(envelope.payload, envelope.signature, c.statistics, c.n,
                                        c.epsilon_spent, self.now_ms(), noise)
        with self._lock:
            # Re-check under the lock: the round may have closed, or this site answered, while
            # the statistics were decoded. Then reserve the site's slot and the nonce.
            self._check_contribution(c, live, envelope)
            self.auth.take_nonce(envelope.key_id, c.nonce, c.timestamp_unix_ms, "Contribution",
                             persist=False)
            # The site's recorded spend must stay within the total it declared.
            beyond = self.budgets.reserve(site, c.epsilon_spent, c.round_id)
            if beyond:
                raise Rejected("FAILED_PRECONDITION", beyond)
            live.storing[site] = accepted
            self.auth.nonces.add((envelope.key_id, c.nonce))
        # Durable before anything in memory changes or the site is answered; committed
        # together with the contributions arriving at the same time (RoundStore group
        # commit), without holding the manager lock so they can join the same transaction.
        return Admission(live, c, envelope, accepted)

    def abandon_contribution(self, admission: Admission) -> None:
        """The admitted contribution was not stored: free its slot and nonce."""
        live, c = admission.live, admission.contribution
        with self._lock:
            del live.storing[c.site_id]
            self.auth.nonces.discard((admission.envelope.key_id, c.nonce))
            self.budgets.release(c.site_id, c.epsilon_spent)
            self._close_if_due(live)

    def complete_contribution(self, admission: Admission) -> pb.ContributeReply:
        """The admitted contribution is durable: count it, add it to the running sum, and
        close the round if that reached the quorum (or a deadline passed meanwhile)."""
        live, c, accepted = admission.live, admission.contribution, admission.accepted
        with self._lock:
            del live.storing[c.site_id]
            live.contributions[c.site_id] = accepted
            self.budgets.commit(c.site_id, c.epsilon_spent, accepted.received_ms)
            if admission.secagg is not None:   # secure: the masked input joins the session
                if live.state == RELEASE:
                    live.session.record(admission.secagg)
            else:
                live.running.add_encoded(c.statistics)
            self.registry.touch(c.site_id, accepted.received_ms)
            count = len(live.contributions)
            log.debug("round %s: accepted contribution of %s (n=%d), %d of %d participant(s)",
                      c.round_id, c.site_id, c.n, count, len(live.participants))
            self._close_if_due(live)
        # The exact-sum arithmetic of a full block, outside the lock (RunningTotal.fold).
        if admission.secagg is None:
            live.running.fold()
        return pb.ContributeReply(round_id=c.round_id, accepted=True, duplicate=False,
                                  message=f"accepted ({count} of {len(live.participants)} "
                                          f"participant(s), quorum {live.stored.quorum})")

    def expected_noise(self, round_id: str) -> dpnoise.NoiseDescription:
        """The noise description every contribution to ``round_id`` must declare."""
        with self._lock:
            live = self._round(round_id)
        if live.expected_noise is None:
            live.expected_noise = round_expected_noise(live.spec)
        return live.expected_noise

    def _check_noise(self, c: pb.Contribution, live: LiveRound) -> dpnoise.NoiseDescription:
        """The contribution's declared noise, if it is exactly what the round's spec implies
        (law, scale, draws and grid of every part); else Rejected. A missing description is a
        disagreement: statistics of unknown noise are never summed as if known."""
        expected = live.expected_noise
        if expected is None:
            expected = live.expected_noise = round_expected_noise(live.spec)
        declared = self._declared_noise(c, expected)
        if declared != expected:
            raise Rejected("INVALID_ARGUMENT",
                           f"noise description ({declared.summary()}) differs from what round "
                           f"{c.round_id!r} specifies ({expected.summary()}): wrong mechanism, "
                           f"relation, split or bounds")
        return declared

    @staticmethod
    def _declared_noise(c: pb.Contribution, expected: dpnoise.NoiseDescription
                        ) -> dpnoise.NoiseDescription:
        """The noise description ``c`` declares; Rejected if it has none or it is malformed."""
        if not c.HasField("noise"):
            raise Rejected("INVALID_ARGUMENT", "contribution declares no noise description; "
                                               f"round {c.round_id!r} expects "
                                               f"{expected.summary()}")
        try:
            return _noise_of(c.noise.SerializeToString(deterministic=True))
        except dpnoise.NoiseError as exc:
            raise Rejected("INVALID_ARGUMENT", f"invalid noise description: {exc}") from None

    def _check_contribution(self, c: pb.Contribution, live: LiveRound,
                            envelope: pb.SignedEnvelope) -> None:
        if c.site_id not in live.invited:
            raise Rejected("PERMISSION_DENIED", f"site {c.site_id!r} is not invited to round "
                                                f"{c.round_id!r}")
        if live.state == CONSENT:
            raise Rejected("FAILED_PRECONDITION", f"round {c.round_id!r} is in its consent "
                                                  f"phase: no release is taken before it ends")
        if live.state != RELEASE:
            raise Rejected("FAILED_PRECONDITION", f"round {c.round_id!r} is closed ({live.state})")
        if c.site_id not in live.participants:
            raise Rejected("FAILED_PRECONDITION", f"site {c.site_id!r} is not a participant of "
                                                  f"round {c.round_id!r} (it did not consent "
                                                  f"in time)")
        if c.spec_digest != live.stored.spec_digest:
            raise Rejected("FAILED_PRECONDITION", f"spec_digest {c.spec_digest[:16]} does not "
                                                  f"match round {c.round_id!r} "
                                                  f"({live.stored.spec_digest[:16]})")
        if c.site_id in live.contributions:
            raise Rejected("ALREADY_EXISTS", f"site {c.site_id!r} already contributed a different "
                                             f"release to round {c.round_id!r}")
        if c.site_id in live.storing:
            # Retryable: once stored, a retry of the same release is answered as a duplicate.
            raise Rejected("UNAVAILABLE", f"a contribution of site {c.site_id!r} to round "
                                          f"{c.round_id!r} is being stored; retry")
        if c.site_id in live.refusals:
            raise Rejected("ALREADY_EXISTS", f"site {c.site_id!r} refused round {c.round_id!r}")
        self.auth.check_fresh(c.timestamp_unix_ms, "Contribution")

    def refuse(self, envelope: pb.SignedEnvelope, peer: identity.PeerIdentity | None = None) -> pb.Ack:
        r = self.auth.verify_site(envelope, "dpfed.v1.Refusal", peer)
        live = self._round(r.round_id)
        with self._lock:
            if live.refusals.get(r.site_id) is not None:
                return pb.Ack(message="refusal already recorded")
            if r.site_id not in live.invited:
                raise Rejected("PERMISSION_DENIED", f"site {r.site_id!r} is not invited")
            if live.state not in COLLECTING:
                raise Rejected("FAILED_PRECONDITION", f"round {r.round_id!r} is closed ({live.state})")
            if live.state != CONSENT and r.site_id not in live.participants:
                raise Rejected("FAILED_PRECONDITION", f"site {r.site_id!r} is not a participant of "
                                                      f"round {r.round_id!r}")
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
            self.auth.check_fresh(r.timestamp_unix_ms, "Refusal")
            if r.epsilon_spent and r.epsilon_spent != live.spec.epsilon:
                # A refusal that debited (noisy n below min_n, drawn first) spent the round's
                # epsilon, no other amount.
                raise Rejected("INVALID_ARGUMENT", f"refusal epsilon_spent {r.epsilon_spent} is "
                                                   f"neither 0 nor the round's epsilon "
                                                   f"{live.spec.epsilon}")
            self.auth.take_nonce(envelope.key_id, r.nonce, r.timestamp_unix_ms, "Refusal",
                             persist=False)
            now = self.now_ms()
            self.store.insert_refusal(r.round_id, r.site_id, r.reason, envelope.SerializeToString(),
                                      now, envelope.key_id, r.nonce, r.timestamp_unix_ms,
                                      epsilon=r.epsilon_spent)
            self.auth.nonces.add((envelope.key_id, r.nonce))
            live.refusals[r.site_id] = r.reason
            if r.epsilon_spent:
                # Recorded, not checked against the declared total: the site already spent it
                # (its ledger debited it), and hiding it would only under-count.
                live.refusal_epsilons[r.site_id] = r.epsilon_spent
                self.budgets.commit(r.site_id, r.epsilon_spent, now, reserved=False)
            log.info("round %s: site %s refused in %s: %s", r.round_id, r.site_id, live.state,
                     r.reason)
            pool = live.invited if live.state == CONSENT else live.participants
            floor = live.stored.quorum
            if secure_round.is_secure(live.spec):
                floor = secure_round.min_contributors(live.spec)
                if live.secure is not None and live.state != CONSENT:
                    pool, floor = live.expected() | set(live.contributions), live.secure.floor
            possible = len(pool - set(live.refusals))
            if possible < floor:
                self._fail(live, f"quorum {floor} is unreachable: refused by "
                                 f"{', '.join(sorted(live.refusals))}"
                                 + ("; no site released" if live.state == CONSENT else ""))
            elif live.state == CONSENT:
                self._end_consent_if_due(live)
            else:
                self._close_if_due(live)
        return pb.Ack(message="refusal recorded")

    # ---- closing, deadlines and fitting ----
    def _arm_deadline(self, round_id: str) -> None:
        """The timer of the current phase: the consent deadline in CONSENT, the round's
        deadline in RELEASE."""
        with self._lock:
            live = self._rounds[round_id]
            if live.state not in COLLECTING or self._closed:
                return
            if live.state == CONSENT:
                due = consent_deadline_ms(live.spec, live.stored.started_ms)
            elif live.step:   # a secure step: its own deadline
                due = live.stored.phase_deadline_ms
            else:
                due = live.stored.deadline_ms
            delay = max(0.0, (due - self.now_ms()) / 1000)
            live.timer = threading.Timer(delay, self._on_deadline,
                                         args=(round_id, live.state, live.step))
            live.timer.daemon = True
            live.timer.start()

    def _close_if_due(self, live: LiveRound) -> None:
        """Under the lock, once nothing is being stored: close at quorum, or carry out a
        deadline that passed while contributions were being committed."""
        if live.secure is not None:
            self._secure_close_if_due(live)
            return
        if live.storing or live.state != RELEASE or self._closed:
            return
        count = len(live.contributions)
        if not live.missing():   # every participant answered
            if count >= live.stored.quorum:
                self._close_for_fit(live, f"every participant answered ({count} release(s) "
                                          f"of {len(live.participants)} participant(s))")
            else:
                self._fail(live, f"{count} release(s), fewer than the quorum "
                                 f"{live.stored.quorum}; refused: "
                                 f"{', '.join(sorted(live.refusals)) or 'none'}")
        elif live.deadline_due:
            self._deadline_passed(live)

    def _on_deadline(self, round_id: str, state: str | None = None, step: str = "") -> None:
        with self._lock:
            live = self._rounds[round_id]
            if live.state not in COLLECTING or self._closed:
                return
            if state is not None and (live.state, live.step) != (state, step):
                return   # the timer of a phase that already ended
            if live.state == CONSENT:
                if live.consents_storing:
                    live.deadline_due = True   # carried out once they are durable
                    return
                self._end_consent(live, "consent deadline passed")
                return
            if live.secure is not None:
                live.deadline_due = True   # decided now, or by the last message being stored
                self._secure_close_if_due(live)
                return
            if live.storing:
                live.deadline_due = True   # decided by the last contribution being stored
                return
            self._deadline_passed(live)

    def _deadline_passed(self, live: LiveRound) -> None:
        count = len(live.contributions)
        missing = live.missing()
        if count >= live.stored.quorum:
            self._close_for_fit(live, f"deadline passed with quorum ({count}); dropped: "
                                      f"{', '.join(missing) or 'none'}")
        else:
            self._fail(live, f"deadline passed with {count} of quorum {live.stored.quorum} "
                             f"release(s); dropped: {', '.join(missing) or 'none'}"
                             + (f"; refused: {', '.join(sorted(live.refusals))}"
                                if live.refusals else ""))

    def _fail(self, live: LiveRound, message: str) -> None:
        live.enter_phase(FAILED, self.now_ms())
        self.store.set_state(live.stored.round_id, FAILED, message, phases=live.stored.phases)
        live.stored.state, live.stored.message = FAILED, message
        if live.timer:
            live.timer.cancel()
        log.warning("round %s: FAILED: %s", live.stored.round_id, message)

    def _close_for_fit(self, live: LiveRound, why: str) -> None:
        now = self.now_ms()
        round_s = (now - live.stored.started_ms) / 1000
        live.enter_phase(FITTING, now)
        self.store.set_state(live.stored.round_id, FITTING, why, round_s=round_s,
                             phases=live.stored.phases)
        live.stored.state, live.stored.message, live.stored.round_s = FITTING, why, round_s
        if live.timer:
            live.timer.cancel()
        log.info("round %s: closed after %.3f s: %s", live.stored.round_id, round_s, why)
        self._submit_fit(live.stored.round_id)

    def _submit_fit(self, round_id: str) -> None:
        if not self._closed:
            self._fit_pool.submit(self._fit, round_id)

    def _fit(self, round_id: str) -> None:
        with self._lock:
            live = self._rounds[round_id]
            parts = sorted(live.contributions.items())
            running = live.running.copy()
            dropped, phases = live.dropped(), [list(p) for p in live.stored.phases]
        spec = live.spec
        try:
            result, total, fit_s = fit_round(spec, running, parts, round_s=live.stored.round_s,
                                             skip_fit=self.skip_fit, dropped=dropped,
                                             phases=phases)
        except Exception as exc:  # noqa: BLE001 - any fit error fails the round, visibly
            log.exception("round %s: fit failed", round_id)
            with self._lock:
                if not self._closed:
                    self._fail(live, f"fit failed: {type(exc).__name__}: {exc}")
            return
        with self._lock:
            if self._closed:
                return  # a restart re-fits; the store still says FITTING
            live.enter_phase(DONE, self.now_ms())
            self.store.finish_round(result, fit_s, phases=live.stored.phases)
            live.stored.state, live.stored.fit_s, live.stored.message = DONE, fit_s, ""
        log.info("round %s: DONE, n_total=%d, fit %.2f s (%s)", round_id, total.n, fit_s,
                 "skipped" if self.skip_fit else spec.fit_method or "auto")

    def aggregated_statistics(self, round_id: str) -> Statistics:
        """The sum the model is fitted on (for tests and audits): the running total of the
        accepted releases plus the public statistics."""
        with self._lock:
            live = self._round(round_id)
            if secure_round.is_secure(live.spec):
                if not live.contributions:
                    self._load_contributions(live)
                running = self._secure_total(live).copy()
                noise = sum_noise(c.noise for c in live.contributions.values())
                return with_public(running, live.spec, noise)
            if live.running is None:   # a finished round loaded from the store
                stored = self.store.contributions(round_id)
                parts = [c.statistics for c in stored]
                if not parts and not live.spec.public_statistics:
                    return Statistics.zeros(live.stored.dim)
                noise = sum_noise(stored_noise(parse_envelope(c.envelope).payload)
                                   for c in stored)
                return aggregate.aggregate_encoded(parts, live.spec.public_statistics,
                                                   noise=noise)
            running = live.running.copy()
            noise = sum_noise(c.noise for c in live.contributions.values())
        return with_public(running, live.spec, noise)
