"""What the aggregator holds about one round: its phase, the answers of its sites, and the
noise its sum carries. Plain data; the transitions live in aggregator.rounds.RoundManager.

Phases (docs/protocol.md): CONSENT (sites check the spec; nothing released, nothing
debited) -> RELEASE (the sites selected at the end of consent release; each debits as it
stores its release) -> FITTING -> DONE, or FAILED at any point before DONE. OPEN is the state
of rounds stored before phases existed; they are recovered as RELEASE with every invited
site selected (their old meaning).

Secure rounds (spec.aggregation = "secure") have two more: CONSENT -> KEYS (steps advertise
and share_keys: nothing drawn, nothing debited) -> RELEASE (step release: masked releases)
-> UNMASK (steps confirm, then unmask) -> FITTING -> DONE. The step within a state is
``LiveRound.step``.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

from dpfed import noise as dpnoise
from dpfed.sensitivity import expected_noise, row_norm_bound
from dpfed.statistics import Statistics
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.canonical import parse_canonical

from aggregator import aggregate
from aggregator.contribution_wire import fast_contribution
from aggregator.store import StoredContribution, StoredRound

CONSENT, RELEASE, FITTING, DONE, FAILED = "CONSENT", "RELEASE", "FITTING", "DONE", "FAILED"
KEYS, UNMASK = "KEYS", "UNMASK"   # secure aggregation only
OPEN = "OPEN"   # legacy (stored before phases): recovered as RELEASE
STATE_TO_PB = {CONSENT: pb.RoundStatus.CONSENT, RELEASE: pb.RoundStatus.RELEASE,
               FITTING: pb.RoundStatus.FITTING, DONE: pb.RoundStatus.DONE,
               FAILED: pb.RoundStatus.FAILED, OPEN: pb.RoundStatus.OPEN,
               KEYS: pb.RoundStatus.KEYS, UNMASK: pb.RoundStatus.UNMASK}
# States in which the round still takes answers from sites.
COLLECTING = (CONSENT, KEYS, RELEASE, UNMASK)
# Secure steps (LiveRound.step), the state each belongs to, and the share of the time left
# that each gets as its deadline (docs/protocol.md, "Secure rounds").
ADVERTISE, SHARE_KEYS, RELEASE_STEP = "advertise", "share_keys", "release"
CONFIRM_STEP, UNMASK_STEP = "confirm", "unmask"
SECURE_STEPS = (ADVERTISE, SHARE_KEYS, RELEASE_STEP, CONFIRM_STEP, UNMASK_STEP)
STEP_STATE = {ADVERTISE: KEYS, SHARE_KEYS: KEYS, RELEASE_STEP: RELEASE, CONFIRM_STEP: UNMASK,
              UNMASK_STEP: UNMASK}
STEP_WEIGHT = {ADVERTISE: 1, SHARE_KEYS: 1, RELEASE_STEP: 2, CONFIRM_STEP: 1, UNMASK_STEP: 1}
# The PhaseMessage phase a site answers each step's notice with, and the notice's phase.
STEP_NOTICE = {ADVERTISE: "keys", SHARE_KEYS: "share_keys", RELEASE_STEP: "release",
               CONFIRM_STEP: "confirm", UNMASK_STEP: "unmask"}


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
    # Secure rounds: the masked input (a dpfed.secagg MaskedInput message); statistics is
    # empty and n 0.
    masked: bytes = b""



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


def sum_noise(noises) -> dpnoise.NoiseDescription | None:
    """Sum of independent releases' descriptions (K draws for K sites), starting from EXACT
    (public statistics add no noise); None (unknown) if any is unknown."""
    counts: dict[dpnoise.NoiseDescription, int] = {}
    for n in noises:
        if n is None:
            return None
        counts[n] = counts.get(n, 0) + 1
    # Equal descriptions (every site of a round declares the same) summed in one step each:
    # 1000 additions one by one cost 17 ms at the close of a 1000-site round.
    total = dpnoise.EXACT
    for n, k in counts.items():
        total = total + n.repeated(k)
    return total


def stored_noise(payload: bytes) -> dpnoise.NoiseDescription | None:
    """The noise description a stored contribution declared (None if it has none)."""
    msg = fast_contribution(payload) or parse_canonical(payload, "dpfed.v1.Contribution")
    return dpnoise.from_proto(msg.noise) if msg.HasField("noise") else None



@dataclass
class LiveRound:
    stored: StoredRound
    spec: pb.RoundSpec
    envelope: pb.SignedEnvelope
    invited: frozenset[str]
    # Consent phase: site -> when its consent arrived.
    consents: dict[str, int] = field(default_factory=dict)
    # Consents checked and being committed (group commit, outside the manager lock).
    # site -> done once its commit ended (a resend meanwhile waits for it).
    consents_storing: dict[str, Future] = field(default_factory=dict)
    # The sites selected to release, fixed when the consent phase ends (None before).
    participants: frozenset[str] | None = None
    contributions: dict[str, AcceptedContribution] = field(default_factory=dict)
    refusals: dict[str, str] = field(default_factory=dict)
    # Epsilon a refusing site debited (Refusal.epsilon_spent; only those > 0).
    refusal_epsilons: dict[str, float] = field(default_factory=dict)
    timer: threading.Timer | None = None
    # Exact sum of the accepted releases, updated as each is accepted so that closing the
    # round costs no pass over them (aggregator.exact_sum; equal to summing at close).
    running: aggregate.RunningTotal | None = None
    # Contributions checked and being committed (group commit, outside the manager lock):
    # they hold their site's slot, and the round does not close or fail at its deadline
    # until they are durable and published (then ``deadline_due``).
    storing: dict[str, AcceptedContribution] = field(default_factory=dict)
    deadline_due: bool = False
    # What every contribution must declare (round_expected_noise), computed once.
    expected_noise: dpnoise.NoiseDescription | None = None
    # ---- secure rounds (None / empty otherwise) ----
    # dpfed.secure_round.SecureRound and the aggregator's dpfed.secagg AggregatorSession,
    # built when consent ends (and by replaying the stored messages after a restart).
    secure: object | None = None
    session: object | None = None
    # Sites whose message of the current step was accepted (site -> ms), and those being
    # stored (site -> the checked secagg message); for the release step: contributions.
    answers: dict[str, int] = field(default_factory=dict)
    pending: dict[str, object] = field(default_factory=dict)
    # What the current step's notice carries for each site (bytes), and the notices built.
    outputs: dict[str, bytes] = field(default_factory=dict)
    # The "keys" notice's body (every participant's identity key), encoded once per round.
    keys_body: bytes | None = None
    notices: dict[str, pb.SignedEnvelope] = field(default_factory=dict)
    # A finished round loaded from the store: its contributions stay there (``contributions``
    # is empty) and this is how many there are; None while they are in memory.
    archived: int | None = None

    @property
    def state(self) -> str:
        return self.stored.state

    @property
    def step(self) -> str:
        """The secure step ('' for independent rounds and outside KEYS..UNMASK)."""
        return self.stored.secure_step if self.state in (KEYS, RELEASE, UNMASK) else ""

    def expected(self) -> frozenset[str]:
        """Secure rounds: the sites the current step waits for an answer from (participants
        for advertise, then the sets U1, U2, U3 of the secagg session)."""
        if self.step == ADVERTISE or self.session is None:
            return self.participants or frozenset()
        return frozenset(self.session.current_set())

    def missing(self) -> list[str]:
        """Sites the current phase still waits for."""
        if self.state == CONSENT:
            return sorted(self.invited - set(self.consents) - set(self.refusals))
        if self.step in (ADVERTISE, SHARE_KEYS, CONFIRM_STEP, UNMASK_STEP):
            return sorted(self.expected() - set(self.answers) - set(self.pending)
                          - set(self.refusals))
        if self.state == RELEASE:
            pool = self.expected() if self.step == RELEASE_STEP else self.participants
            return sorted(pool - set(self.contributions) - set(self.storing)
                          - set(self.refusals))
        return []

    def dropped(self, contributed=None) -> list[str]:
        """Participants that never answered the release phase (known once it ended).
        ``contributed``: the sites that released, when not ``contributions`` (archived)."""
        if self.participants is None or self.state in (CONSENT, KEYS, RELEASE):
            return []
        contributed = set(self.contributions if contributed is None else contributed)
        return sorted(self.participants - contributed - set(self.refusals))

    def enter_phase(self, phase: str, now_ms: int) -> None:
        """Stop the running phase's clock and, unless the round ended, start ``phase``'s
        (kept in ``stored.phases``, written with the next state change)."""
        phases = self.stored.phases
        if phases and phases[-1][2] == 0:
            phases[-1][2] = max(1e-3, (now_ms - phases[-1][1]) / 1000)
        if phase not in (DONE, FAILED):
            phases.append([phase, now_ms, 0.0])


@dataclass
class Admission:
    """A contribution that passed every check and holds its slot in the round
    (RoundManager.admit_contribution), to be stored, then completed or abandoned."""
    live: LiveRound
    contribution: pb.Contribution
    envelope: pb.SignedEnvelope
    accepted: AcceptedContribution
    reply: pb.ContributeReply | None = None   # an identical retry: answered, nothing to store
    # Secure rounds: the masked input the secagg session checked (recorded once stored).
    secagg: object | None = None

    def row(self) -> tuple[StoredContribution, str, str, int]:
        """The arguments of RoundStore.insert_contribution for this contribution."""
        c, a = self.contribution, self.accepted
        return (StoredContribution(c.round_id, c.site_id, self.envelope.SerializeToString(),
                                   c.statistics, c.n, c.epsilon_spent, a.received_ms),
                self.envelope.key_id, c.nonce, c.timestamp_unix_ms)




def with_public(running: aggregate.RunningTotal, spec: pb.RoundSpec,
                 noise: dpnoise.NoiseDescription | None) -> Statistics:
    """``running`` (a copy: it is changed) plus the spec's public statistics, if any, carrying
    ``noise``: the sum of the accepted contributions' descriptions (the public statistics are
    exact and add none)."""
    if spec.public_statistics:
        running.add_encoded(spec.public_statistics)
    return running.total(noise=noise)
