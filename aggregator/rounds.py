"""The life of a round at the aggregator, as plain methods the gRPC servicer adapts.

OPEN (collecting signed contributions) -> FITTING (quorum reached, or the deadline passed with
quorum) -> DONE (result stored), or FAILED (deadline without quorum, quorum unreachable after
refusals, or a fit error). Every state change is one store transaction first and an in-memory
change second, so the in-memory view never runs ahead of what a restart would reload.

Checks are ordered cheapest first and authentication before anything that reveals round
state; nothing that is rejected reaches the store or a round's contributions.
"""

from __future__ import annotations

import binascii
import json
import logging
import math
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from google.protobuf import json_format

from dpfed import noise as dpnoise
from dpfed.sensitivity import expected_noise, row_norm_bound
from dpfed.statistics import Statistics, StatisticsError, encoded_values
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.canonical import CanonicalError, digest, parse_canonical
from dpfed.wire.signing import SignatureError, verify, verify_signature
from dpfed.wire import limits

from aggregator import aggregate, identity
from aggregator.budget import SiteBudgets
from aggregator.registry import Registry
from aggregator.store import RoundStore, StoredContribution, StoredResult, StoredRound

log = logging.getLogger(__name__)

OPEN, FITTING, DONE, FAILED = "OPEN", "FITTING", "DONE", "FAILED"
STATE_TO_PB = {OPEN: pb.RoundStatus.OPEN, FITTING: pb.RoundStatus.FITTING,
               DONE: pb.RoundStatus.DONE, FAILED: pb.RoundStatus.FAILED}


class Rejected(Exception):
    """A request the aggregator refuses. ``code`` is the name of a grpc.StatusCode."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class AcceptedContribution:
    payload: bytes
    signature: bytes
    statistics: bytes      # checked dpfed Statistics encoding; added to the running total
    n: int
    epsilon: float
    received_ms: int
    # The noise it declared (checked equal to the round's expected noise when admitted).
    noise: dpnoise.NoiseDescription | None = None


def round_expected_noise(spec: pb.RoundSpec) -> dpnoise.NoiseDescription:
    """The NoiseDescription every contribution to ``spec`` must declare: one release of the
    spec's mechanism (dpfed.sensitivity.expected_noise; "" = add_remove / exact; the row-norm
    bound R = 1 when the spec's pre-processing normalises rows, ``row_norm_bound``). Raises
    ValueError for a spec whose mechanism is invalid (validate_spec refuses those first)."""
    return expected_noise(len(spec.feature_names), spec.epsilon, spec.x_bound, spec.y_bound,
                          tuple(spec.budget_split),
                          neighbouring=spec.neighbouring or "add_remove",
                          xtx_sensitivity=spec.xtx_sensitivity or "exact",
                          x_norm_bound=row_norm_bound(spec.preprocessing.normalize_rows))


def _sum_noise(noises) -> dpnoise.NoiseDescription | None:
    """Sum of independent releases' descriptions (K draws for K sites), starting from EXACT
    (public statistics add no noise); None (unknown) if any is unknown."""
    total = dpnoise.EXACT
    for n in noises:
        if n is None:
            return None
        total = total + n
    return total


def _stored_noise(payload: bytes) -> dpnoise.NoiseDescription | None:
    """The noise description a stored contribution declared (None if it has none)."""
    msg = _fast_contribution(payload) or parse_canonical(payload, "dpfed.v1.Contribution")
    return dpnoise.from_proto(msg.noise) if msg.HasField("noise") else None


@dataclass
class LiveRound:
    stored: StoredRound
    spec: pb.RoundSpec
    envelope: pb.SignedEnvelope
    invited: frozenset[str]
    contributions: dict[str, AcceptedContribution] = field(default_factory=dict)
    refusals: dict[str, str] = field(default_factory=dict)
    # Epsilon a refusing site debited (Refusal.epsilon_spent; only those > 0).
    refusal_epsilons: dict[str, float] = field(default_factory=dict)
    timer: threading.Timer | None = None
    # Exact sum of the accepted releases, updated as each is accepted so that closing the
    # round costs no pass over them (aggregator.exact_sum; equal to summing at close).
    running: aggregate.RunningTotal | None = None
    # Contributions checked and being committed (group commit, outside the manager lock):
    # they count towards the quorum so no more are taken, and the round does not close or
    # fail at its deadline until they are durable and published (then ``deadline_due``).
    storing: dict[str, AcceptedContribution] = field(default_factory=dict)
    deadline_due: bool = False
    # What every contribution must declare (round_expected_noise), computed once.
    expected_noise: dpnoise.NoiseDescription | None = None

    @property
    def state(self) -> str:
        return self.stored.state

    def missing(self) -> list[str]:
        return sorted(self.invited - set(self.contributions) - set(self.refusals))


@dataclass
class Admission:
    """A contribution that passed every check and holds its slot in the round
    (RoundManager.admit_contribution), to be stored, then completed or abandoned."""
    live: LiveRound
    contribution: pb.Contribution
    envelope: pb.SignedEnvelope
    accepted: AcceptedContribution
    reply: pb.ContributeReply | None = None   # an identical retry: answered, nothing to store

    def row(self) -> tuple[StoredContribution, str, str, int]:
        """The arguments of RoundStore.insert_contribution for this contribution."""
        c, a = self.contribution, self.accepted
        return (StoredContribution(c.round_id, c.site_id, self.envelope.SerializeToString(),
                                   c.statistics, c.n, c.epsilon_spent, a.received_ms),
                self.envelope.key_id, c.nonce, c.timestamp_unix_ms)


_CONTRIBUTION_FIELDS = {"round_id": str, "site_id": str, "statistics": str, "n": str,
                        "epsilon_spent": (int, float), "spec_digest": str,
                        "timestamp_unix_ms": str, "nonce": str, "noise": dict}


_STATISTICS_KEY = b'"statistics":"'
# Stands in for the base64 statistics while the rest of the payload is parsed and re-encoded:
# any non-empty string would do (an empty one is omitted from canonical JSON).
_PLACEHOLDER = "A"


def _fast_contribution(payload: bytes) -> pb.Contribution | None:
    """Decode a canonical Contribution payload without protobuf's json_format, which costs
    about 1 ms per 17 kB contribution (d = 64) on the hot path. Accepts only when
    re-encoding the decoded fields the way canonical_bytes does reproduces ``payload`` byte
    for byte; anything else returns None and the caller uses the reference parser, so the
    accepted language is unchanged (tests/test_aggregator_rounds.py checks both agree).

    The 23 kB base64 statistics string is cut out before JSON sees it (the JSON scanner and
    encoder would each walk it character by character) and decoded on its own: the rest, with
    a one-character placeholder in its place, must re-encode to itself. That is enough,
    because in canonical JSON a raw ``"`` only delimits strings (inside one it is escaped as
    ``\\"``), so the first ``"statistics":"`` of an encoding that round-trips is the key, and
    the cut value holds only base64 characters (checked by the decoder), which JSON never
    escapes."""
    try:
        cut = payload.find(_STATISTICS_KEY)
        if cut >= 0:
            cut += len(_STATISTICS_KEY)
            end = payload.find(b'"', cut)
            if end < 0:
                return None
            b64, rest = payload[cut:end], payload[:cut] + _PLACEHOLDER.encode() + payload[end:]
        else:
            b64, rest = b"", payload
        obj = json.loads(rest)
        if not isinstance(obj, dict) or not obj.keys() <= _CONTRIBUTION_FIELDS.keys():
            return None
        for k, v in obj.items():
            if not isinstance(v, _CONTRIBUTION_FIELDS[k]) or isinstance(v, bool):
                return None
        if (cut >= 0) != ("statistics" in obj) or obj.get("statistics", _PLACEHOLDER) != _PLACEHOLDER:
            return None
        stats = _canonical_b64decode(b64)
        if stats is None:
            return None
        n = int(obj.get("n", "0"))
        ts = int(obj.get("timestamp_unix_ms", "0"))
        eps = float(obj.get("epsilon_spent", 0.0))
        if not (0 <= n < 2**64 and -2**63 <= ts < 2**63 and math.isfinite(eps)):
            return None
        msg = pb.Contribution(round_id=obj.get("round_id", ""), site_id=obj.get("site_id", ""),
                              statistics=stats, n=n, epsilon_spent=eps,
                              spec_digest=obj.get("spec_digest", ""), timestamp_unix_ms=ts,
                              nonce=obj.get("nonce", ""))
        noise = None
        if "noise" in obj:  # a few terms: protobuf's own JSON mapping is cheap enough here
            json_format.ParseDict(obj["noise"], msg.noise)
            msg.noise.SetInParent()
            noise = json_format.MessageToDict(msg.noise, preserving_proto_field_name=True)
        again = {k: v for k, v in (
            ("round_id", msg.round_id), ("site_id", msg.site_id),
            ("statistics", _PLACEHOLDER if stats else ""),
            ("n", str(n) if n else ""), ("epsilon_spent", eps if eps else None),
            ("spec_digest", msg.spec_digest), ("timestamp_unix_ms", str(ts) if ts else ""),
            ("nonce", msg.nonce), ("noise", noise)) if v not in ("", None)}
        canonical = json.dumps(again, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                               allow_nan=False).encode("utf-8")
        return msg if canonical == rest else None
    except (ValueError, TypeError, UnicodeDecodeError, binascii.Error, json_format.ParseError):
        return None


def _check_envelope_size(envelope: pb.SignedEnvelope) -> None:
    """Wire limits (dpfed.wire.limits) before any signature work: cheap, and an oversized
    field never reaches the verifier, the store or a log line."""
    problems = limits.envelope_problems(envelope)
    if problems:
        raise Rejected("INVALID_ARGUMENT", "envelope: " + "; ".join(problems))


def _check_fields(check, value) -> None:
    try:
        check(value)
    except limits.LimitError as exc:
        raise Rejected("INVALID_ARGUMENT", str(exc)) from None


def _canonical_b64decode(text: bytes) -> bytes | None:
    """The bytes ``text`` encodes if it is the standard padded base64 that
    ``base64.b64encode`` produces, else None. Strict decoding rejects other alphabets, missing
    or excess padding and anything after it; what it still accepts is non-zero unused bits in
    the last quantum (b"QR==" decodes like b"QQ=="), so only that quantum is re-encoded: the
    full check without re-encoding the whole 17 kB (d = 64) on the hot path."""
    try:
        data = binascii.a2b_base64(text, strict_mode=True)
    except binascii.Error:
        return None
    if len(text) != 4 * -(-len(data) // 3):
        return None
    tail = len(data) % 3 or 3
    if data and binascii.b2a_base64(data[-tail:], newline=False) != text[-4:]:
        return None
    return data


def _parse_envelope(data: bytes) -> pb.SignedEnvelope:
    env = pb.SignedEnvelope()
    env.ParseFromString(data)
    return env


class RoundManager:
    def __init__(self, store: RoundStore, registry: Registry, *, max_clock_skew_s: float = 300.0,
                 skip_fit: bool = False, clock=time.time):
        self.store = store
        self.registry = registry
        self.max_clock_skew_ms = int(max_clock_skew_s * 1000)
        self.skip_fit = skip_fit
        self.clock = clock
        self._lock = threading.RLock()
        self._rounds: dict[str, LiveRound] = {}
        self._nonces: set[tuple[str, str]] = set()
        self._subscribers: dict[int, tuple[str, queue.Queue]] = {}
        self._next_subscriber = 0
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
        now = self.now_ms()
        self.store.prune_nonces(now - self.max_clock_skew_ms)
        self._nonces = set(self.store.nonces_since(now - self.max_clock_skew_ms))
        refit, reopen = [], []
        with self._lock:
            for stored in self.store.rounds():
                env = _parse_envelope(stored.spec_envelope)
                spec = parse_canonical(env.payload, "dpfed.v1.RoundSpec")
                live = LiveRound(stored, spec, env, frozenset(stored.invited))
                if stored.state in (OPEN, FITTING):
                    stored_contributions = self.store.contributions(stored.round_id)
                    for c in stored_contributions:
                        env_c = _parse_envelope(c.envelope)
                        live.contributions[c.site_id] = AcceptedContribution(
                            env_c.payload, env_c.signature,
                            c.statistics, c.n, c.epsilon, c.received_ms,
                            _stored_noise(env_c.payload))
                    live.running = aggregate.RunningTotal(stored.dim)
                    if stored_contributions:
                        live.running.add_rows(
                            np.stack([encoded_values(c.statistics) for c in stored_contributions]),
                            sum(c.n for c in stored_contributions))
                live.refusals = dict(self.store.refusals(stored.round_id))
                live.refusal_epsilons = self.store.refusal_epsilons(stored.round_id)
                self._rounds[stored.round_id] = live
                if stored.state == OPEN:
                    reopen.append(stored.round_id)
                elif stored.state == FITTING:
                    refit.append(stored.round_id)
        for rid in reopen:
            log.info("round %s: reopened after restart with %d contribution(s)", rid,
                     len(self._rounds[rid].contributions))
            self._arm_deadline(rid)
        for rid in refit:
            log.info("round %s: fit was interrupted by a restart, fitting again", rid)
            self._submit_fit(rid)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for live in self._rounds.values():
                if live.timer:
                    live.timer.cancel()
            for _, q in self._subscribers.values():
                q.put(None)
        self._fit_pool.shutdown(wait=False, cancel_futures=True)

    # ---- common checks ----
    def _check_fresh(self, timestamp_ms: int, what: str) -> None:
        skew = abs(self.now_ms() - timestamp_ms)
        if skew > self.max_clock_skew_ms:
            raise Rejected("UNAUTHENTICATED",
                           f"{what} timestamp is {skew / 1000:.0f} s away from the aggregator's "
                           f"clock (allowed {self.max_clock_skew_ms / 1000:.0f} s): stale or "
                           f"clock out of sync")

    def _verify_site(self, envelope: pb.SignedEnvelope, type_name: str,
                     peer: identity.PeerIdentity | None = None):
        _check_envelope_size(envelope)
        msg = None
        if type_name == "dpfed.v1.Contribution" and envelope.payload_type == type_name:
            public_key = self.registry.site_keys.get(envelope.key_id)
            if public_key is not None:
                # Same order as signing.verify: bytes verified first, parsed only after.
                try:
                    verify_signature(envelope, public_key, type_name)
                except SignatureError as exc:
                    raise Rejected("UNAUTHENTICATED", str(exc)) from None
                msg = _fast_contribution(envelope.payload)
        try:
            if msg is None:
                msg = verify(envelope, self.registry.site_keys, type_name)
        except SignatureError as exc:
            raise Rejected("UNAUTHENTICATED", str(exc)) from None
        except CanonicalError as exc:
            raise Rejected("INVALID_ARGUMENT", str(exc)) from None
        _check_fields(limits.SITE_MESSAGE_CHECKS[type_name], msg)
        owner = self.registry.site_of_key(envelope.key_id)
        if msg.site_id != owner:
            raise Rejected("PERMISSION_DENIED",
                           f"{type_name} claims site {msg.site_id!r} but is signed by the key "
                           f"of {owner!r}")
        # Key and TLS certificate must name the same site (aggregator.identity).
        mismatch = identity.site_mismatch(peer, msg.site_id)
        if mismatch:
            raise Rejected("PERMISSION_DENIED", f"{type_name}: {mismatch}")
        return msg

    def _round(self, round_id: str) -> LiveRound:
        live = self._rounds.get(round_id)
        if live is None:
            raise Rejected("FAILED_PRECONDITION", f"unknown round {round_id!r}")
        return live

    # ---- coordinator side ----
    def start_round(self, envelope: pb.SignedEnvelope,
                    peer: identity.PeerIdentity | None = None) -> pb.RoundStatus:
        _check_envelope_size(envelope)
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
        if not problems:
            try:  # what every contribution must declare; also refuses degenerate scales
                expected = round_expected_noise(spec)
            except ValueError as exc:
                problems.append(str(exc))
        if problems:
            raise Rejected("INVALID_ARGUMENT", "invalid round spec: " + "; ".join(problems))
        invited = sorted(spec.sites) if spec.sites else self.registry.site_ids()
        stored = StoredRound(spec.round_id, envelope.SerializeToString(), digest(envelope.payload),
                             len(spec.feature_names), spec.quorum, spec.deadline_unix_ms, invited,
                             OPEN, "", now, 0.0, 0.0)
        with self._lock:
            if spec.round_id in self._rounds:
                raise Rejected("ALREADY_EXISTS", f"round {spec.round_id!r} already exists")
            self.store.insert_round(stored)
            self._rounds[spec.round_id] = LiveRound(
                stored, spec, envelope, frozenset(invited),
                running=aggregate.RunningTotal(len(spec.feature_names)),
                expected_noise=expected)
            for site_id, q in self._subscribers.values():
                if site_id in invited:
                    q.put(spec.round_id)
        log.info("round %s: started by %s, d=%d, eps=%g, quorum %d of %d invited site(s), "
                 "deadline in %.0f s", spec.round_id, owner, len(spec.feature_names),
                 spec.epsilon, spec.quorum, len(invited), (spec.deadline_unix_ms - now) / 1000)
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
        _check_fields(limits.check_round_query, round_id)
        reader, reader_kid = self._reader(peer)
        with self._lock:
            live = self._rounds.get(round_id)
            if live is None:
                raise Rejected("NOT_FOUND", f"unknown round {round_id!r}")
            s = live.stored
            contributions = sorted(live.contributions.items())
            refusals = sorted(live.refusals.items())
            status = pb.RoundStatus(
                round_id=round_id, state=STATE_TO_PB[s.state], quorum=s.quorum,
                deadline_unix_ms=s.deadline_ms, message=s.message, spec_digest=s.spec_digest,
                round_seconds=s.round_s, fit_seconds=s.fit_s, missing_sites=live.missing())
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
                declared_total_epsilon=b.declared_total))
        return reply

    # ---- site side ----
    def hello(self, envelope: pb.SignedEnvelope, peer: identity.PeerIdentity | None = None,
              *, declare: bool = True) -> str:
        """Authenticate a SiteHello; returns the site id. ``declare``: record the total budget
        and trusted coordinators it declares (Subscribe; not GetSiteHistory)."""
        hello = self._verify_site(envelope, "dpfed.v1.SiteHello", peer)
        self._check_fresh(hello.timestamp_unix_ms, "SiteHello")
        self._take_nonce(envelope.key_id, hello.nonce, hello.timestamp_unix_ms, "SiteHello")
        if declare:
            self.budgets.declare(hello, envelope, self.now_ms())
        return hello.site_id

    def site_history(self, envelope: pb.SignedEnvelope,
                     peer: identity.PeerIdentity | None = None) -> pb.SiteHistory:
        """The aggregator's record of the spending of the site whose signed SiteHello this is
        (GetSiteHistory): only that site may ask, over its own TLS identity."""
        return self.budgets.history(self.hello(envelope, peer, declare=False))

    def _take_nonce(self, kid: str, nonce: str, timestamp_ms: int, what: str,
                    persist: bool = True) -> None:
        if not nonce:
            raise Rejected("INVALID_ARGUMENT", f"{what} has no nonce")
        with self._lock:
            if (kid, nonce) in self._nonces:
                raise Rejected("ALREADY_EXISTS", f"{what} nonce {nonce[:16]} was already used "
                                                 f"(replay)")
            if persist:
                self.store.insert_nonce(kid, nonce, timestamp_ms)
                self._nonces.add((kid, nonce))

    def subscribe(self, site_id: str, updates=None) -> tuple[int, object]:
        """Register a round stream of ``site_id``: the id of every round it is invited to is
        put on ``updates`` (anything with a thread-safe ``put``; default a new queue.Queue)
        as the round starts, and None when the aggregator shuts down.

        One identity, one live stream: while ``site_id`` has a stream, another is refused
        with ALREADY_EXISTS. Two processes started from one kit would otherwise both get
        every round, each draw fresh noise and debit its own ledger (issue 11, finding 1).
        The identity is free again when the first stream ends (``unsubscribe``); a stream
        whose peer vanished without closing is ended by gRPC keepalive (about 40 s)."""
        with self._lock:
            if any(s == site_id for s, _ in self._subscribers.values()):
                raise Rejected("ALREADY_EXISTS",
                               f"site {site_id!r} already has a live round stream at the "
                               f"aggregator: only one process per site identity may be "
                               f"connected (is another site node running with this kit?)")
            token = self._next_subscriber
            self._next_subscriber += 1
            q = queue.Queue() if updates is None else updates
            if self._closed:
                q.put(None)
            self._subscribers[token] = (site_id, q)
        self.registry.mark_connected(site_id, self.now_ms())
        log.info("site %s subscribed", site_id)
        return token, q

    def unsubscribe(self, token: int) -> None:
        with self._lock:
            site_id, _ = self._subscribers.pop(token, (None, None))
        if site_id:
            self.registry.mark_disconnected(site_id, self.now_ms())
            log.info("site %s unsubscribed", site_id)

    def spec_for_site(self, round_id: str, site_id: str) -> pb.SignedEnvelope | None:
        """The signed spec of ``round_id`` if the site still has to answer it."""
        with self._lock:
            live = self._rounds.get(round_id)
            if (live is None or live.state != OPEN or site_id not in live.invited
                    or site_id in live.contributions or site_id in live.storing
                    or site_id in live.refusals):
                return None
            return live.envelope

    def pending_rounds(self, site_id: str) -> list[str]:
        with self._lock:
            return [rid for rid, live in self._rounds.items()
                    if self.spec_for_site(rid, site_id) is not None]

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
        c = self._verify_site(envelope, "dpfed.v1.Contribution", peer)
        live = self._round(c.round_id)
        site = c.site_id
        with self._lock:
            previous = live.contributions.get(site)
        if previous is not None and previous.payload == envelope.payload:
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
            if len(live.contributions) + len(live.storing) >= live.stored.quorum:
                raise Rejected("FAILED_PRECONDITION", f"round {c.round_id!r} is closed (quorum "
                                                      f"reached)")
            self._take_nonce(envelope.key_id, c.nonce, c.timestamp_unix_ms, "Contribution",
                             persist=False)
            # The site's recorded spend must stay within the total it declared.
            beyond = self.budgets.reserve(site, c.epsilon_spent, c.round_id)
            if beyond:
                raise Rejected("FAILED_PRECONDITION", beyond)
            live.storing[site] = accepted
            self._nonces.add((envelope.key_id, c.nonce))
        # Durable before anything in memory changes or the site is answered; committed
        # together with the contributions arriving at the same time (RoundStore group
        # commit), without holding the manager lock so they can join the same transaction.
        return Admission(live, c, envelope, accepted)

    def abandon_contribution(self, admission: Admission) -> None:
        """The admitted contribution was not stored: free its slot and nonce."""
        live, c = admission.live, admission.contribution
        with self._lock:
            del live.storing[c.site_id]
            self._nonces.discard((admission.envelope.key_id, c.nonce))
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
            live.running.add_encoded(c.statistics)
            self.registry.touch(c.site_id, accepted.received_ms)
            count = len(live.contributions)
            log.debug("round %s: accepted contribution of %s (n=%d), %d of quorum %d",
                      c.round_id, c.site_id, c.n, count, live.stored.quorum)
            self._close_if_due(live)
        # The exact-sum arithmetic of a full block, outside the lock (RunningTotal.fold).
        live.running.fold()
        return pb.ContributeReply(round_id=c.round_id, accepted=True, duplicate=False,
                                  message=f"accepted ({count} of quorum {live.stored.quorum})")

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
        if not c.HasField("noise"):
            raise Rejected("INVALID_ARGUMENT", "contribution declares no noise description; "
                                               f"round {c.round_id!r} expects "
                                               f"{expected.summary()}")
        try:
            declared = dpnoise.from_proto(c.noise)
        except dpnoise.NoiseError as exc:
            raise Rejected("INVALID_ARGUMENT", f"invalid noise description: {exc}") from None
        if declared != expected:
            raise Rejected("INVALID_ARGUMENT",
                           f"noise description ({declared.summary()}) differs from what round "
                           f"{c.round_id!r} specifies ({expected.summary()}): wrong mechanism, "
                           f"relation, split or bounds")
        return declared

    def _check_contribution(self, c: pb.Contribution, live: LiveRound,
                            envelope: pb.SignedEnvelope) -> None:
        if live.state != OPEN:
            raise Rejected("FAILED_PRECONDITION", f"round {c.round_id!r} is closed ({live.state})")
        if c.site_id not in live.invited:
            raise Rejected("PERMISSION_DENIED", f"site {c.site_id!r} is not invited to round "
                                                f"{c.round_id!r}")
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
        self._check_fresh(c.timestamp_unix_ms, "Contribution")

    def refuse(self, envelope: pb.SignedEnvelope, peer: identity.PeerIdentity | None = None) -> pb.Ack:
        r = self._verify_site(envelope, "dpfed.v1.Refusal", peer)
        live = self._round(r.round_id)
        with self._lock:
            if live.refusals.get(r.site_id) is not None:
                return pb.Ack(message="refusal already recorded")
            if live.state != OPEN:
                raise Rejected("FAILED_PRECONDITION", f"round {r.round_id!r} is closed ({live.state})")
            if r.site_id not in live.invited:
                raise Rejected("PERMISSION_DENIED", f"site {r.site_id!r} is not invited")
            if r.spec_digest != live.stored.spec_digest:
                raise Rejected("FAILED_PRECONDITION", "spec_digest does not match the round")
            if r.site_id in live.contributions or r.site_id in live.storing:
                raise Rejected("ALREADY_EXISTS", f"site {r.site_id!r} already contributed")
            self._check_fresh(r.timestamp_unix_ms, "Refusal")
            if r.epsilon_spent and r.epsilon_spent != live.spec.epsilon:
                # A refusal that debited (noisy n below min_n, drawn first) spent the round's
                # epsilon, no other amount.
                raise Rejected("INVALID_ARGUMENT", f"refusal epsilon_spent {r.epsilon_spent} is "
                                                   f"neither 0 nor the round's epsilon "
                                                   f"{live.spec.epsilon}")
            self._take_nonce(envelope.key_id, r.nonce, r.timestamp_unix_ms, "Refusal",
                             persist=False)
            now = self.now_ms()
            self.store.insert_refusal(r.round_id, r.site_id, r.reason, envelope.SerializeToString(),
                                      now, envelope.key_id, r.nonce, r.timestamp_unix_ms,
                                      epsilon=r.epsilon_spent)
            self._nonces.add((envelope.key_id, r.nonce))
            live.refusals[r.site_id] = r.reason
            if r.epsilon_spent:
                # Recorded, not checked against the declared total: the site already spent it
                # (its ledger debited it), and hiding it would only under-count.
                live.refusal_epsilons[r.site_id] = r.epsilon_spent
                self.budgets.commit(r.site_id, r.epsilon_spent, now, reserved=False)
            log.info("round %s: site %s refused: %s", r.round_id, r.site_id, r.reason)
            possible = len(live.invited) - len(live.refusals)
            if possible < live.stored.quorum:
                self._fail(live, f"quorum {live.stored.quorum} is unreachable: refused by "
                                 f"{', '.join(sorted(live.refusals))}")
        return pb.Ack(message="refusal recorded")

    # ---- closing, deadlines and fitting ----
    def _arm_deadline(self, round_id: str) -> None:
        with self._lock:
            live = self._rounds[round_id]
            if live.state != OPEN or self._closed:
                return
            delay = max(0.0, (live.stored.deadline_ms - self.now_ms()) / 1000)
            live.timer = threading.Timer(delay, self._on_deadline, args=(round_id,))
            live.timer.daemon = True
            live.timer.start()

    def _close_if_due(self, live: LiveRound) -> None:
        """Under the lock, once nothing is being stored: close at quorum, or carry out a
        deadline that passed while contributions were being committed."""
        if live.storing or live.state != OPEN or self._closed:
            return
        count = len(live.contributions)
        if count >= live.stored.quorum:
            self._close_for_fit(live, f"quorum reached ({count} of {len(live.invited)})")
        elif live.deadline_due:
            self._deadline_passed(live)

    def _on_deadline(self, round_id: str) -> None:
        with self._lock:
            live = self._rounds[round_id]
            if live.state != OPEN or self._closed:
                return
            if live.storing:
                live.deadline_due = True   # decided by the last contribution being stored
                return
            self._deadline_passed(live)

    def _deadline_passed(self, live: LiveRound) -> None:
        count = len(live.contributions)
        if count >= live.stored.quorum:
            self._close_for_fit(live, f"deadline passed with quorum ({count})")
        else:
            missing = live.missing()
            self._fail(live, f"deadline passed with {count} of quorum {live.stored.quorum} "
                             f"contribution(s); missing: {', '.join(missing) or 'none'}"
                             + (f"; refused: {', '.join(sorted(live.refusals))}"
                                if live.refusals else ""))

    def _fail(self, live: LiveRound, message: str) -> None:
        self.store.set_state(live.stored.round_id, FAILED, message)
        live.stored.state, live.stored.message = FAILED, message
        if live.timer:
            live.timer.cancel()
        log.warning("round %s: FAILED: %s", live.stored.round_id, message)

    def _close_for_fit(self, live: LiveRound, why: str) -> None:
        round_s = (self.now_ms() - live.stored.started_ms) / 1000
        self.store.set_state(live.stored.round_id, FITTING, why, round_s=round_s)
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
        spec = live.spec
        t0 = time.perf_counter()
        try:
            public = aggregate.public_statistics(spec)
            total = _with_public(running, spec, _sum_noise(c.noise for _, c in parts))
            d = total.dim
            if self.skip_fit:
                beta_mean, draws, diag = np.zeros(d), np.zeros((0, d)), {"skipped": True}
            else:
                beta_mean, draws, diag = aggregate.fit(total, spec.fit_method, spec.fit_draws,
                                                       spec.fit_seed or None, public=public,
                                                       x_bound=spec.x_bound or None)
            fit_s = time.perf_counter() - t0
            summary = aggregate.summarize(
                spec=spec, contributions=[(s, c.n, c.epsilon) for s, c in parts], total=total,
                public=public, beta_mean=beta_mean, beta_draws=draws, diagnostics=diag,
                round_s=live.stored.round_s, fit_s=fit_s)
            result = StoredResult(round_id, json.dumps(summary, sort_keys=True),
                                  np.ascontiguousarray(draws, dtype="<f8").tobytes(),
                                  int(draws.shape[0]), int(d))
        except Exception as exc:  # noqa: BLE001 - any fit error fails the round, visibly
            log.exception("round %s: fit failed", round_id)
            with self._lock:
                if not self._closed:
                    self._fail(live, f"fit failed: {type(exc).__name__}: {exc}")
            return
        with self._lock:
            if self._closed:
                return  # a restart re-fits; the store still says FITTING
            self.store.finish_round(result, fit_s)
            live.stored.state, live.stored.fit_s, live.stored.message = DONE, fit_s, ""
        log.info("round %s: DONE, n_total=%d, fit %.2f s (%s)", round_id, total.n, fit_s,
                 "skipped" if self.skip_fit else spec.fit_method or "auto")

    def aggregated_statistics(self, round_id: str) -> Statistics:
        """The sum the model is fitted on (for tests and audits): the running total of the
        accepted releases plus the public statistics."""
        with self._lock:
            live = self._round(round_id)
            if live.running is None:   # a finished round loaded from the store
                stored = self.store.contributions(round_id)
                parts = [c.statistics for c in stored]
                if not parts and not live.spec.public_statistics:
                    return Statistics.zeros(live.stored.dim)
                noise = _sum_noise(_stored_noise(_parse_envelope(c.envelope).payload)
                                   for c in stored)
                return aggregate.aggregate_encoded(parts, live.spec.public_statistics,
                                                   noise=noise)
            running = live.running.copy()
            noise = _sum_noise(c.noise for c in live.contributions.values())
        return _with_public(running, live.spec, noise)


def _with_public(running: aggregate.RunningTotal, spec: pb.RoundSpec,
                 noise: dpnoise.NoiseDescription | None) -> Statistics:
    """``running`` (a copy: it is changed) plus the spec's public statistics, if any, carrying
    ``noise``: the sum of the accepted contributions' descriptions (the public statistics are
    exact and add none)."""
    if spec.public_statistics:
        running.add_encoded(spec.public_statistics)
    return running.total(noise=noise)
