"""A lying aggregator against real site code (issue 19, method.md section 12).

The aggregator relays every message, so it decides what each site sees; up to c sites collude
with it and hand over everything they hold. These tests play that aggregator with the
production ``SiteSession`` (every message through its bytes) and then ask what the coalition
can compute from what it collected:

- ``both_secrets``: an honest site whose self-mask seed b_v *and* mask key s_v the coalition
  can reconstruct (>= t Shamir shares of each, honest answers plus the colluders' own shares).
- ``recoverable_sums``: the minimal sets of honest masked inputs whose sum the coalition can
  unmask. An honest input y_v = x_v + PRG(b_v) + sum_{w in R_v} +-PRG(s_vw) is usable only
  if b_v is known; a pair mask is removable if s_v or s_w is known or w colludes; otherwise
  it cancels only against y_w, and only if w masked with v too (R_w contains v). The usable
  inputs, joined by their irremovable pair masks, form components: exactly the sums the
  coalition can compute (it can add or subtract its own members' inputs at will).

Claim (docs/secure_aggregation.md, "A lying aggregator"): whatever the aggregator shows each
site, no honest site loses both secrets, and every recoverable sum holds at least T honest
contributors, i.e. a sum over at least T + c contributors once the colluders' own are added.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpfed.secagg import csprng
from dpfed.secagg.errors import SecAggError, TooFewSurvivors, UnsafeRequest
from dpfed.secagg.messages import (AdvertisementBundle, MaskAttestation, ShareDelivery,
                                   SurvivorCertificate, SurvivorList, SurvivorSignature,
                                   UnmaskRequest, survivors_digest)
from dpfed.secagg.protocol import RoundConfig, SiteSession
from dpfed.wire.signing import SigningKey

L = 4


class Coalition:
    """The aggregator and its colluders in one round: it drives the honest sites' sessions
    through ``SiteSession`` and records every share that leaves them."""

    def __init__(self, K, T, c, *, adversary="semi_malicious", round_id="lying-1"):
        self.ids = tuple(f"s{i:02d}" for i in range(K))
        self.corrupt = set(self.ids[K - c:]) if c else set()
        self.honest = [s for s in self.ids if s not in self.corrupt]
        self.cfg = RoundConfig.create(round_id, self.ids, L, min_contributors=T + c,
                                      noise_threshold=T, colluders=c, adversary=adversary)
        self.graph = self.cfg.graph()
        self.keys = {s: SigningKey.generate() for s in self.ids}
        public = {s: k.public_key for s, k in self.keys.items()}
        self.sites = {s: SiteSession(self.cfg, s, self.keys[s], public) for s in self.ids}
        self.head = {"round_id": round_id, "config_digest": self.cfg.digest, "sender": ""}
        self.adverts = {s: self.sites[s].advertise() for s in self.ids}
        self.share_msgs = {}
        for s in self.ids:
            mine = tuple(self.adverts[h] for h in self.graph.holders(s))
            self.share_msgs[s] = self.sites[s].share_keys(
                AdvertisementBundle(**self.head, recipient=s, adverts=mine).to_bytes())
        self.masked = {}                  # site -> MaskedInput it sent
        self.signatures = {}              # honest site -> SurvivorSignature it sent
        self.seed_shares: dict[str, set[int]] = {s: set() for s in self.ids}
        self.key_shares: dict[str, set[int]] = {s: set() for s in self.ids}
        self.refusals: list[str] = []

    # -- phase 2: the aggregator picks which shares each site receives
    def deliver(self, site, senders=None):
        """Send ``site`` the shares addressed to it by ``senders`` (default: all that shared);
        returns whether the site sent its masked input."""
        shares = tuple(es for u in self.ids if u != site and (senders is None or u in senders)
                       for es in self.share_msgs[u].shares if es.recipient == site)
        try:
            self.masked[site] = self.sites[site].masked_input(
                ShareDelivery(**self.head, recipient=site, shares=shares).to_bytes(),
                csprng.random_u64(L))
            return True
        except SecAggError as exc:
            self.refusals.append(f"{site}: {type(exc).__name__}")
            return False

    # -- phase 3: each site is shown a survivor list of the aggregator's choosing
    def show(self, site, survivors) -> bool:
        lst = SurvivorList(**self.head, recipient=site, survivors=tuple(sorted(survivors)))
        try:
            self.signatures[site] = self.sites[site].confirm(lst.to_bytes())
            return True
        except SecAggError as exc:
            self.refusals.append(f"{site}: {type(exc).__name__}")
            return False

    def forged_signature(self, colluder, survivors) -> SurvivorSignature:
        d = survivors_digest(self.cfg.round_id, self.cfg.digest, tuple(sorted(survivors)))
        return SurvivorSignature(**{**self.head, "sender": colluder}, digest=d
                                 ).signed_by(self.keys[colluder])

    def attestation(self, w, survivors):
        if w in self.corrupt:            # a colluder attests whatever suits the coalition
            claim = tuple(sorted(set(survivors) & set(self.graph.neighbours(w))))
            return MaskAttestation(**{**self.head, "sender": w}, masked_with=claim
                                   ).signed_by(self.keys[w])
        m = self.masked.get(w)
        return None if m is None else m.attestation

    # -- phase 4: ask for shares with every genuine signature the coalition holds on the set
    def ask(self, site, survivors):
        survivors = tuple(sorted(survivors))
        d = survivors_digest(self.cfg.round_id, self.cfg.digest, survivors)
        conf = [sig for s, sig in sorted(self.signatures.items())
                if s in survivors and sig.digest == d]
        conf += [self.forged_signature(w, survivors) for w in sorted(self.corrupt)
                 if w in survivors]
        att = [self.attestation(w, survivors) for w in sorted(set(survivors)
                                                              & set(self.graph.holders(site)))
               if w != site]
        cert = SurvivorCertificate(**self.head, survivors=survivors, confirmations=tuple(conf))
        req = UnmaskRequest(**self.head, recipient=site, certificate=cert, confirmations=(),
                            attestations=tuple(a for a in att if a is not None))
        try:
            resp = self.sites[site].unmask(req.to_bytes())
        except SecAggError as exc:
            self.refusals.append(f"{site}: {type(exc).__name__}")
            return False
        index = self.graph.index(site)
        for owner, _ in resp.seed_shares:
            self.seed_shares[owner].add(index)
        for owner, _ in resp.key_shares:
            self.key_shares[owner].add(index)
        return True

    # -- what the coalition can compute
    def _colluders_shares(self):
        for h in self.corrupt:
            index = self.graph.index(h)
            for v in self.sites[h]._received:
                self.seed_shares[v].add(index)
                self.key_shares[v].add(index)

    def knowledge(self):
        self._colluders_shares()
        t = self.cfg.threshold
        b = {v for v in self.ids if len(self.seed_shares[v]) >= t} | self.corrupt
        s = {v for v in self.ids if len(self.key_shares[v]) >= t} | self.corrupt
        return b, s

    def both_secrets(self) -> set[str]:
        b, s = self.knowledge()
        return {v for v in self.honest if v in b and v in s}

    def recoverable_sums(self) -> list[set[str]]:
        b, s = self.knowledge()
        masked_with = {v: set(self.sites[v]._received) for v in self.masked}
        sent = {v for v in self.honest if v in self.masked}

        def hidden_partners(v):
            return {w for w in masked_with[v]
                    if w not in self.corrupt and v not in s and w not in s}
        usable = {v for v in sent if v in b}
        changed = True
        while changed:
            changed = False
            for v in sorted(usable):
                if any(w not in usable or v not in masked_with.get(w, ())
                       for w in hidden_partners(v)):
                    usable.discard(v)
                    changed = True
        components, seen = [], set()
        for v in sorted(usable):
            if v in seen:
                continue
            comp, stack = {v}, [v]
            while stack:
                for w in hidden_partners(stack.pop()):
                    if w not in comp:
                        comp.add(w)
                        stack.append(w)
            seen |= comp
            components.append(comp)
        return components

    def check(self, T):
        assert not self.both_secrets(), f"both secrets of {self.both_secrets()}"
        for comp in self.recoverable_sums():
            assert len(comp) >= T, f"a sum over {len(comp)} honest inputs < T = {T}: {comp}"


def _everyone_masks(co: Coalition):
    for s in co.ids:
        co.deliver(s)


# ============================================================== the attack of issue 19, item 1

@pytest.mark.parametrize("K, T", [(5, 3), (10, 5)])
def test_isolation_attack_gets_no_share_and_the_round_fails_saying_why(K, T):
    """u is told "only you survived", every other w "u and w survived, the rest dropped".
    Before issue 19 every honest site answered and u's input came out with 1/T of its noise."""
    co = Coalition(K, T, 0)
    _everyone_masks(co)
    u = co.ids[0]
    views = {u: {u}} | {w: {u, w} for w in co.ids[1:]}
    signed = {w: co.show(w, views[w]) for w in co.ids}
    assert not any(signed.values())                     # every site refused to sign
    for w in co.ids:
        if signed[w]:
            co.ask(w, views[w])
    assert all(not v for v in co.seed_shares.values())  # no share of any secret left a site
    assert all(not v for v in co.key_shares.values())
    assert len(co.refusals) == K and all("TooFewSurvivors" in r for r in co.refusals)
    co.check(T)


@pytest.mark.parametrize("K, T, c", [(5, 3, 0), (5, 3, 1), (10, 5, 0), (10, 3, 2)])
def test_isolation_padded_to_the_floors_still_recovers_no_lone_input(K, T, c):
    """The same attack with every list padded to pass the size floors: u sees a set with u,
    the others a set without u. The two sets cannot both gather the quorum of signatures, so
    u's self-mask and its key never both come out, and no sum of fewer than T honest inputs
    can be unmasked."""
    co = Coalition(K, T, c)
    _everyone_masks(co)
    u = co.honest[0]
    floor = co.cfg.survivor_floor
    others = [s for s in co.ids if s != u]
    with_u = {u, *others[:floor - 1]}
    without_u = set(others[-floor:])
    for w in co.honest:
        co.show(w, with_u if w in with_u and w not in without_u else without_u)
    for w in co.honest:
        if w in co.signatures:
            co.ask(w, with_u if u in co.sites[w]._survivors else without_u)
    co.check(T)


def test_a_survivor_that_masked_only_with_the_dropped_keeps_its_self_mask():
    """The aggregator gives w only the shares of a and b, so w masks with those two alone;
    then it declares a and b dropped and asks everybody else, who did sign the survivor set,
    for w's self-mask shares and a's and b's mask keys. w's signed attestation shows that its
    input does not carry the masks of its surviving neighbours: nobody reveals w's share."""
    co = Coalition(10, 2, 0, adversary="semi_honest")
    w, a, b = co.ids[0], co.ids[1], co.ids[2]
    for s in co.ids:
        co.deliver(s, senders={a, b} if s == w else None)
    u3 = set(co.ids) - {a, b}
    for s in co.ids:
        co.show(s, u3)
    assert set(co.signatures) == u3 - {w}               # w itself refuses to sign
    assert len(co.signatures) >= co.cfg.quorum
    for s in sorted(co.signatures):
        assert not co.ask(s, u3)                        # "no attestation that w masked ..."
    assert not co.seed_shares[w]
    co.check(2)


def test_the_honest_round_passes_the_same_checks():
    """The control: shown one set, everyone reveals and the coalition can unmask the whole sum
    (one component with every honest site) and nothing smaller."""
    co = Coalition(6, 3, 1)
    _everyone_masks(co)
    for w in co.honest:
        assert co.show(w, set(co.ids))
    for w in co.honest:
        assert co.ask(w, set(co.ids))
    assert co.recoverable_sums() == [set(co.honest)]
    co.check(3)


def test_a_sum_the_checks_would_refuse_is_detected_by_the_analysis():
    """The analysis itself can fail: a site that masked with nobody honest, once its
    self-mask is revealed, is a recoverable sum of one."""
    co = Coalition(6, 3, 2, adversary="semi_honest")
    u = co.honest[0]
    for s in co.ids:
        co.deliver(s, senders=co.corrupt if s == u else None)
    co._colluders_shares()
    co.seed_shares[u] |= {co.graph.index(h) for h in co.honest}   # as if they answered
    with pytest.raises(AssertionError, match="< T"):
        co.check(3)


# ============================================================== both secrets, over a grid

GRID = [(K, T, c) for K in (3, 4, 5, 6, 8, 10) for T in (1, 2, 3) for c in (0, 1, 2)
        if T + c <= K and c < K / 2]


@pytest.mark.parametrize("K, T, c", GRID)
@pytest.mark.parametrize("adversary", ["semi_malicious", "semi_honest"])
def test_aggregator_and_c_colluders_never_get_both_secrets(K, T, c, adversary):
    """Every honest site is shown either a set with all sites or a set without one victim;
    the colluders sign both. With K = 5, T = 3, c = 1 this recovered an honest input before
    (the threshold ignored c)."""
    for victim in range(K - c):
        co = Coalition(K, T, c, adversary=adversary, round_id=f"grid-{victim}")
        _everyone_masks(co)
        v = co.honest[victim]
        full, without = set(co.ids), set(co.ids) - {v}
        split = len(co.honest) // 2
        views = {w: (full if i < split or w == v else without)
                 for i, w in enumerate(co.honest)}
        for w in co.honest:
            co.show(w, views[w])
        for w in co.honest:
            if w in co.signatures:
                co.ask(w, views[w])
        co.check(T)


# ============================================================== random lying strategies

@st.composite
def _strategy(draw):
    K = draw(st.integers(3, 20))
    c = draw(st.integers(0, (K - 1) // 3))
    T = draw(st.integers(1, max(1, min(5, K - c))))
    adversary = draw(st.sampled_from(["semi_malicious", "semi_honest"]))
    return K, T, c, adversary


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params=_strategy(), data=st.data())
def test_no_lying_strategy_recovers_a_sum_of_fewer_than_T_honest_inputs(params, data):
    K, T, c, adversary = params
    co = Coalition(K, T, c, adversary=adversary, round_id="prop")
    ids = list(co.ids)
    # phase 2: each honest site gets the shares of a subset of the others (dropped shares)
    for s in ids:
        if s in co.corrupt:
            co.deliver(s)
            continue
        if data.draw(st.booleans(), label=f"drop {s} before masking"):
            continue
        keep = data.draw(st.sets(st.sampled_from([x for x in ids if x != s])),
                         label=f"senders to {s}")
        co.deliver(s, senders=keep if data.draw(st.booleans(), label="partial") else None)
    sent = sorted(co.masked)
    if not sent:
        return
    # phase 3: a few candidate survivor sets, each honest site shown one of them
    n_sets = data.draw(st.integers(1, 3), label="distinct sets")
    candidates = [data.draw(st.sets(st.sampled_from(ids), min_size=1), label="set")
                  for _ in range(n_sets)]
    views = {w: candidates[data.draw(st.integers(0, n_sets - 1), label=f"set of {w}")]
             for w in co.honest}
    for w in co.honest:
        if w in co.masked:
            co.show(w, views[w])
    # phase 4: every site that signed is asked, for the set it signed or another candidate
    for w in co.honest:
        if w in co.signatures:
            asked = views[w] if data.draw(st.booleans(), label="same set") else \
                candidates[data.draw(st.integers(0, n_sets - 1), label="other set")]
            co.ask(w, asked)
    co.check(T)
