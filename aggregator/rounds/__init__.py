"""The life of a round at the aggregator.

Phases (docs/protocol.md; the states and the one table of their changes in
``aggregator.rounds.states``):

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
  release masked inputs in RELEASE and unmask the sum (UNMASK) before FITTING.

Where each part is (one RoundContext, ``context``, is all they share):

    manager         RoundManager: the facade the gRPC servicer (aggregator.service) calls
    states          the states, the secure steps, TRANSITIONS (the legal changes)
    transitions     the one place a round changes state: when each phase ends, where it
                    goes, what entering a state starts (deadline timers, the fit)
    deadlines       when each phase ends at the latest
    start           StartRound: the signed spec checked, the round stored in CONSENT
    consent         the sites' consents (group-committed)
    release         the sites' releases, plain or masked: admitted, group-committed, summed
    secure_steps    the sites' messages in the key and unmasking steps of a secure round
    secure_session  a secure round's secagg session: built, stepped, unmasked, replayed
    fitting         FITTING: the sum plus the public statistics fitted, the result stored
    refusals        a site's refusal, in any phase that takes answers
    slots           whether a site may answer the current step (release and secure steps)
    reads           status, result, sites, spending, ListRounds, what a site is pushed
    recovery        reloading every round after a restart
    live            what is held about a round in memory
    contributions   what a round's sum is made of: the accepted releases, the noise each
                    must declare, the noise of their sum, the total with the public statistics

Who sent a message and whether it is fresh is aggregator.authentication's; the sites' open
streams are aggregator.subscribers'; what arrives on the wire is checked by
aggregator.contribution_wire.

Rules every part keeps:

* Every state change is one store transaction first and an in-memory change second, so the
  in-memory view never runs ahead of what a restart would reload
  (``transitions.Transitions.enter``, the only code that changes a round's state).
* One lock (``RoundContext.lock``, reentrant) guards every round in memory. An answer is
  checked and its site's slot and nonce reserved under it, stored by the store's group
  commit outside it (so answers arriving together share one transaction), and counted under
  it once durable; a phase does not end while an answer is being stored.
* Checks are ordered cheapest first and authentication before anything that reveals round
  state; nothing that is rejected reaches the store or a round's answers.
"""

from aggregator.errors import Rejected
from aggregator.rounds.contributions import round_expected_noise
from aggregator.rounds.manager import RoundManager

__all__ = ["Rejected", "RoundManager", "round_expected_noise"]
