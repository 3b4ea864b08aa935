"""dpfed.accounting: closed forms, monotonicity, and never looser than the truth (checked against
Google's dp-accounting PLD, the tight reference) nor than the budget it enforces."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpfed import accounting as acc
from dpfed import gaussian as g

pytest.importorskip("dp_accounting")
from aggregator.privacy_report import UnsupportedEvent, pld_delta, pld_epsilon, pld_of  # noqa: E402

DELTAS = (1e-5, 1e-8)


def test_pure_dp_rdp_is_randomized_response_and_within_the_zcdp_bound():
    for eps in (0.01, 0.3, 1.0, 3.0):
        p = math.exp(eps) / (1 + math.exp(eps))
        for a in (1.1, 2.0, 7.5, 64.0):
            direct = math.log(p ** a * (1 - p) ** (1 - a) + (1 - p) ** a * p ** (1 - a)) / (a - 1)
            r = acc.pure_dp_rdp(eps, a)
            assert r == pytest.approx(direct, rel=1e-9, abs=1e-15)
            assert r <= min(eps, a * eps * eps / 2) * (1 + 1e-12)      # eps -> eps^2/2 zCDP
            # the Laplace mechanism's exact RDP (Mironov 2017, Prop. 6) is below the worst case
            lap = math.log(a / (2 * a - 1) * math.exp((a - 1) * eps)
                           + (a - 1) / (2 * a - 1) * math.exp(-a * eps)) / (a - 1)
            assert lap <= r * (1 + 1e-12)


def test_closed_forms():
    # pure eps adds (and a history of pure events gets exactly the sum at delta 0)
    c = acc.compose([acc.PureDP(0.5), acc.PureDP(1.0), acc.PureDP(0.25)])
    assert c.epsilon(1e-6) == pytest.approx(1.75)
    assert c.delta(1.75) == 0.0
    # k Gaussians of mu are one Gaussian of sqrt(k) mu, exactly
    k, mu = 9, 0.4
    many = acc.compose([acc.Gaussian(mu)] * k)
    one = acc.compose([acc.Gaussian(3 * mu)])
    for delta in DELTAS:
        assert many.epsilon(delta) == pytest.approx(one.epsilon(delta), rel=1e-12)
        assert many.epsilon(delta) == pytest.approx(g.gaussian_epsilon(delta, 3 * mu), rel=1e-12)
    assert many.delta(1.0) == pytest.approx(g.gaussian_delta(1.0, 3 * mu), rel=1e-12)
    # conversions of the events
    assert acc.Gaussian.from_rho(0.125).mu == pytest.approx(0.5)
    assert acc.Gaussian.from_sigma(2.0, 4.0).rho == pytest.approx(0.125)
    assert acc.rdp(acc.ZCDP(0.1), 5.0) == pytest.approx(0.5)
    assert acc.compose([]).epsilon(1e-6) == 0.0


def test_monotone():
    base = [acc.PureDP(0.3), acc.Gaussian(0.5), acc.Skellam(2000.0, 60.0, 20.0)]
    c = acc.compose(base)
    more = acc.compose(base + [acc.ZCDP(0.01)])
    for delta in (1e-4, 1e-6, 1e-9):
        assert more.epsilon(delta) >= c.epsilon(delta)
    eps = [c.epsilon(d) for d in (1e-3, 1e-5, 1e-7, 1e-9)]
    assert all(a < b for a, b in zip(eps, eps[1:]))
    dl = [c.delta(e) for e in (0.5, 1.0, 2.0, 4.0)]
    assert all(a >= b for a, b in zip(dl, dl[1:]))
    # the two directions agree: the delta at the reported eps is within the asked delta
    for delta in (1e-5, 1e-8):
        assert c.delta(c.epsilon(delta)) <= delta * (1 + 1e-6)


@pytest.mark.parametrize("events", [
    [acc.PureDP(1.0)] * 3,
    [acc.PureDP(0.1)] * 50,
    [acc.Gaussian(0.7)] * 3,
    [acc.PureDP(0.5), acc.Gaussian(0.5), acc.PureDP(0.2), acc.Gaussian(1.0)],
    [acc.PureDP(0.05)] * 20 + [acc.Gaussian(0.2)] * 10,
])
def test_never_tighter_than_the_exact_pld(events):
    c = acc.compose(events)
    p = pld_of(events)
    for delta in DELTAS:
        exact = p.get_epsilon_for_delta(delta)       # pessimistic: >= the true value
        ours = c.epsilon(delta)
        # never below the truth (PLD's discretisation error is < 1e-3 here) ...
        assert ours >= exact - 1e-3 * len(events), (ours, exact)
        # ... and not far above it (the looseness the RDP route costs, stated in the docs)
        assert ours <= 1.15 * exact + 0.05, (ours, exact)


def test_admits_never_lets_a_history_past_its_budget():
    budget_eps, budget_delta = 2.0, 1e-6
    history: list = []
    candidates = [acc.PureDP(0.3), acc.Gaussian(0.4), acc.PureDP(0.1), acc.Gaussian(0.2)]
    refused = 0
    for i in range(40):
        ev = candidates[i % len(candidates)]
        if acc.admits(history, ev, budget_eps, budget_delta):
            history.append(ev)
        else:
            refused += 1
    assert refused and history
    assert acc.compose(history).epsilon(budget_delta) <= budget_eps
    assert pld_of(history).get_epsilon_for_delta(budget_delta) <= budget_eps + 1e-9
    # every refused event would have crossed the budget
    for ev in candidates:
        if not acc.admits(history, ev, budget_eps, budget_delta):
            assert acc.compose(history + [ev]).epsilon(budget_delta) > budget_eps


def test_renyi_filter_is_within_its_budget():
    eps, delta, alpha = 3.0, 1e-6, 16.0
    history: list = []
    ev = acc.Gaussian(0.3)
    while acc.renyi_filter_admits(history, ev, eps, delta, alpha):
        history.append(ev)
    assert history
    assert acc.compose(history).epsilon(delta) <= eps
    assert acc.renyi_budget(eps, delta, alpha) == pytest.approx(
        eps - math.log(15 / 16) + (math.log(delta) + math.log(16)) / 15)


def test_a_wrong_accountant_would_fail_these_tests():
    # power: an accountant 5 % too optimistic about Gaussians (mu / 1.05) reports an eps below
    # the exact PLD's and fails the first assertion of test_never_tighter_than_the_exact_pld
    events = [acc.Gaussian(0.7)] * 3
    optimistic = acc.compose([acc.Gaussian(0.7 / 1.05)] * 3)
    exact = pld_of(events).get_epsilon_for_delta(1e-5)
    assert optimistic.epsilon(1e-5) < exact - 1e-3 * len(events)


def test_privacy_report_matches_the_closed_forms():
    assert pld_epsilon([acc.PureDP(0.5)] * 4, 1e-6) == pytest.approx(2.0, abs=1e-3)
    assert pld_epsilon([], 1e-6) == 0.0 and pld_delta([], 1.0) == 0.0
    assert pld_delta([acc.Gaussian(1.0)], 1.0) == pytest.approx(g.gaussian_delta(1.0, 1.0), abs=1e-4)
    with pytest.raises(UnsupportedEvent):
        pld_epsilon([acc.ZCDP(0.1)], 1e-6)


def test_bad_events_are_refused():
    with pytest.raises(ValueError):
        acc.PureDP(0.0)
    with pytest.raises(ValueError):
        acc.Gaussian(float("inf"))
    with pytest.raises(TypeError):
        acc.compose([("laplace", 1.0)])
    with pytest.raises(ValueError):
        acc.compose([acc.PureDP(1.0)]).epsilon(0.0)
    with pytest.raises(ValueError):
        acc.rdp(acc.PureDP(1.0), 1.0)
    assert np.isfinite(acc.compose([acc.PureDP(50.0)]).epsilon(1e-6))
