"""The secure-aggregation session of a secure round: built when consent ends, stepped, asked
for each site's notice, unmasked, and rebuilt after a restart. No state change happens here
(aggregator.rounds.transitions decides those); the sites' messages are taken by
aggregator.rounds.secure_steps.

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
another key than the spec pins, no secure round starts (``signing_problem``).

Durability: every message the session consumed is in the store before it is counted (the key
and unmask messages in ``phase_messages``, the masked releases in ``contributions``), together
with its nonce, in one group commit; a step change is one transaction (state, step, its
deadline). The session's outputs are deterministic functions of what it consumed (Ed25519
signatures are deterministic, RFC 8032), so ``replay`` rebuilds it after a restart by feeding
the stored messages through the same steps, and the sites are pushed the same notices again,
byte for byte.
"""

from __future__ import annotations

from dpfed import secure_round
from dpfed.secagg import errors as secagg_errors
from dpfed.secagg.messages import (AGGREGATOR, KeyAdvertisement, ShareKeys, SurvivorSignature,
                                   UnmaskResponse)
from dpfed.secagg.protocol import AggregatorSession
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.canonical import canonical_bytes, parse_canonical

from aggregator import aggregate
from aggregator.errors import Rejected
from aggregator.rounds.context import RoundContext
from aggregator.rounds.live import LiveRound
from aggregator.rounds.states import (ADVERTISE, CONFIRM_STEP, DONE, RELEASE_STEP, SECURE_STEPS,
                                      SHARE_KEYS, STEP_NOTICE, UNMASK_STEP)

# The secagg message each SendPhase phase must carry.
PHASE_MESSAGE_TYPES = {ADVERTISE: KeyAdvertisement, SHARE_KEYS: ShareKeys,
                       CONFIRM_STEP: SurvivorSignature, UNMASK_STEP: UnmaskResponse}
# The AggregatorSession call that closes each step (the unmask step ends with ``unmask``).
CLOSE_STEP = {ADVERTISE: "close_advertisements", SHARE_KEYS: "close_share_keys",
              RELEASE_STEP: "close_masked_inputs", CONFIRM_STEP: "close_consistency"}


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


# ---- building the session ----
def identity_keys(ctx: RoundContext, sites) -> dict:
    unknown = [s for s in sites if s not in ctx.registry.sites]
    if unknown:
        raise secure_round.SecureRoundError(f"invited site(s) {', '.join(unknown[:5])} "
                                            f"are not registered at the aggregator")
    return {s: ctx.registry.sites[s].public_key for s in sites}


def signing_problem(ctx: RoundContext, spec: pb.RoundSpec) -> str:
    """Why this aggregator cannot sign the secagg messages of secure ``spec`` with the key
    the spec pins ("" if it can, or if the spec pins none: dpfed.secure_round.
    secure_problems refuses that)."""
    if ctx.signing_key is None:
        return ("this aggregator has no signing key (signing_key in aggregator.toml): it "
                "signs every secure-aggregation message it sends, and the sites refuse "
                "unsigned ones, so it runs no secure round")
    if spec.aggregator_key_id and spec.aggregator_key_id != ctx.signing_key.key_id:
        return (f"aggregator_key_id names key {spec.aggregator_key_id}, but this aggregator "
                f"signs with key {ctx.signing_key.key_id} (signing_key in "
                f"aggregator.toml): the sites would refuse every message it sends")
    return ""


def new_session(ctx: RoundContext, live: LiveRound, participants, *, signing: bool = True):
    """(SecureRound, AggregatorSession) for ``participants``, signing with the
    aggregator's identity key; SecureRoundError if infeasible (too few for T + c or the
    quorum, a grid that would overflow, no signing key or not the one the spec pins).
    ``signing`` False: a session rebuilt only to compute a finished round's sum, which
    sends nothing, so it needs no key."""
    problem = signing_problem(ctx, live.spec) or (
        "" if live.spec.aggregator_key_id else
        "the spec pins no aggregator key (aggregator_key_id): the sites cannot check the "
        "aggregator's signatures")
    if problem and signing:
        raise secure_round.SecureRoundError(problem)
    secure = secure_round.build(live.spec, participants)
    return secure, AggregatorSession(secure.config, identity_keys(ctx, secure.sites),
                                     signing_key=ctx.signing_key)


# ---- stepping ----
def load_step(live: LiveRound) -> None:
    """Fresh per-step bookkeeping and the step's per-site outputs from the session."""
    live.answers, live.pending, live.notices = {}, {}, {}
    live.deadline_due = False
    live.outputs = {s: m.to_bytes() for s, m in live.session.outputs().items()}


def close_step(live: LiveRound) -> None:
    """Close the current step in the session (not unmask: see ``unmask``); SecAggError if
    the core cannot (too few answers, a share that fails its commitment)."""
    getattr(live.session, CLOSE_STEP[live.step])()


def unmask(live: LiveRound) -> None:
    """finish() the session and keep the decoded sum as the round's running total (n
    clamped at 0: post-processing; a joint round's in an ``aggregator.joint_round.
    JointRunningTotal``). A sum that may have wrapped modulo 2^64 (more rows
    than the grid holds) raises SumOutOfRange: the round fails with its message."""
    result = live.session.finish()
    if live.secure.joint:
        # A joint round (issue 23): the sum in the joint layout (JointStatistics.to_vector),
        # its counts integers; the fit adds the noise of the C declared shares
        # (aggregator.rounds.fitting, sum_noise) and fits each target.
        from aggregator.joint_round import JointRunningTotal
        values, n_x = live.secure.decode_joint_sum(result.vector)
        running = JointRunningTotal(live.stored.dim, len(live.spec.targets))
        running.add_rows(values[None, :], max(0, int(round(n_x))))
        live.running = running
        return
    upper, n = live.secure.decode_sum(result.vector)
    running = aggregate.RunningTotal(live.stored.dim)
    running.add_rows(upper[None, :], max(0, int(round(n))))
    live.running = running


def check_secagg(live: LiveRound, body: bytes, site: str, cls):
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


# ---- what a site is pushed ----
def notice(ctx: RoundContext, live: LiveRound, site: str) -> pb.SignedEnvelope | None:
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
                    {**identity_keys(ctx, sorted(live.participants)),
                     AGGREGATOR: ctx.signing_key.public_key})
            body = live.keys_body
        else:
            body = live.outputs.get(site)
            if body is None:
                return None
        # The signed spec travels with the "keys" notice only; later steps name its
        # digest (the site keeps the spec it verified with the round's state).
        message = pb.PhaseNotice(
            round_id=live.stored.round_id, phase=STEP_NOTICE[step],
            spec_envelope=live.stored.spec_envelope if step == ADVERTISE else b"",
            spec_digest=live.stored.spec_digest,
            participants=sorted(live.participants) if step == ADVERTISE else [],
            deadline_unix_ms=live.stored.phase_deadline_ms, body=body)
        envelope = pb.SignedEnvelope(payload=canonical_bytes(message),
                                     payload_type="dpfed.v1.PhaseNotice")
        live.notices[site] = envelope
    return envelope


# ---- restart ----
def replay(ctx: RoundContext, live: LiveRound, *, finish: bool = False) -> None:
    """Rebuild the session of a secure round from the store: the key messages, the
    masked releases (already in ``live.contributions``) and the unmask answers, fed
    through the steps up to the stored one; with ``finish`` the sum too."""
    stored = live.stored
    step = stored.secure_step or ADVERTISE
    live.secure, live.session = new_session(ctx, live, stored.participants, signing=not finish)
    live.participants = frozenset(stored.participants)
    session = live.session
    answers = {}
    for i, fed in enumerate(SECURE_STEPS[:SECURE_STEPS.index(step) + 1]):
        if i:
            getattr(session, CLOSE_STEP[SECURE_STEPS[i - 1]])()
        if fed == RELEASE_STEP:
            for site in sorted(live.contributions):
                session.receive(live.contributions[site].masked)
            continue
        for site, blob, received_ms in ctx.store.phase_messages(stored.round_id, fed):
            env = pb.SignedEnvelope.FromString(blob)
            session.receive(parse_canonical(env.payload, "dpfed.v1.PhaseMessage").body)
            if fed == step:
                answers[site] = received_ms
    load_step(live)
    live.answers = answers
    if finish:
        unmask(live)


def unmasked_total(ctx: RoundContext, live: LiveRound) -> aggregate.RunningTotal:
    """The decoded sum of a finished secure round (rebuilt from the store if needed)."""
    if live.running is None:
        if live.stored.state != DONE:
            raise Rejected("FAILED_PRECONDITION", f"round {live.stored.round_id!r} has no "
                                                  f"unmasked sum ({live.stored.state})")
        replay(ctx, live, finish=True)
    return live.running
