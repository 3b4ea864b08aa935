"""What the aggregator holds about one round in memory: its stored row, the answers of its
sites, the running sum of their releases, and (secure rounds) the secure-aggregation session.
Plain data: which state comes next is decided in aggregator.rounds.transitions.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

from dpfed import noise as dpnoise
from dpfed.v1 import dpfed_pb2 as pb

from aggregator import aggregate
from aggregator.rounds.contributions import AcceptedContribution
from aggregator.rounds.states import (ADVERTISE, CONFIRM_STEP, CONSENT, FINAL, KEYS, RELEASE,
                                      RELEASE_STEP, SECURE_STATES, SHARE_KEYS, UNMASK_STEP)
from aggregator.store import StoredContribution, StoredRound


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
    # What every contribution must declare
    # (aggregator.rounds.contributions.round_expected_noise), computed once.
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
        return self.stored.secure_step if self.state in SECURE_STATES else ""

    @property
    def phase(self) -> tuple[str, str]:
        """(state, step): the key of aggregator.rounds.states.TRANSITIONS."""
        return self.state, self.step

    def expected(self) -> frozenset[str]:
        """The sites the current step waits for an answer from: the participants (release
        of an independent round, and advertise), then the sets U1, U2, U3 of the secagg
        session."""
        if self.step == ADVERTISE or self.session is None:
            return self.participants or frozenset()
        return frozenset(self.session.current_set())

    def _awaited(self) -> tuple[frozenset | set, tuple]:
        """(the sites the current phase waits on, the collections of those that answered)."""
        if self.state == CONSENT:
            return self.invited, (self.consents, self.refusals)
        if self.step in (ADVERTISE, SHARE_KEYS, CONFIRM_STEP, UNMASK_STEP):
            return self.expected(), (self.answers, self.pending, self.refusals)
        if self.state == RELEASE:
            pool = self.expected() if self.step == RELEASE_STEP else self.participants
            return pool, (self.contributions, self.storing, self.refusals)
        return frozenset(), ()

    def missing(self) -> list[str]:
        """Sites the current phase still waits for."""
        pool, answered = self._awaited()
        return sorted(pool.difference(*answered))

    def any_missing(self) -> bool:
        """``bool(self.missing())``, without building the list while the counts alone show a
        site still awaited (|pool - answered| >= |pool| - sum of |answered|): the phase's end
        is checked after every group commit, and the list costs O(N log N) at N sites."""
        pool, answered = self._awaited()
        if len(pool) > sum(len(a) for a in answered):
            return True
        return bool(pool.difference(*answered))

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
        if phase not in FINAL:
            phases.append([phase, now_ms, 0.0])


@dataclass
class Admission:
    """A contribution that passed every check and holds its slot in the round
    (aggregator.rounds.release.ReleasePhase.admit_contribution), to be stored, then
    completed or abandoned."""
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
