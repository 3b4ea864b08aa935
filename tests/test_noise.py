"""The public noise description (dpfed.noise) and its travel with Statistics."""

import math

import numpy as np
import pytest

from dpfed.noise import EXACT, NoiseDescription, NoiseError, NoiseTerm, from_proto, to_proto
from dpfed.statistics import Statistics, exact_statistics


def _release(b=1.0):
    return NoiseDescription.single("laplace", xtx=2 * b, xty=b, yty=3 * b, n=0.5)


def test_sum_of_k_releases_holds_k_draws_and_k_times_the_variance():
    one = _release()
    total = sum([one] * 9, one)
    assert total.draws("xty") == 10 and total.draws("n") == 10
    assert total.variance("xty") == pytest.approx(10 * 2 * 1.0 ** 2)
    assert total.variance("xtx") == pytest.approx(10 * 2 * 2.0 ** 2)


def test_repeated_is_the_sum_of_k_copies_and_sum_noise_groups_equal_releases():
    from aggregator.rounds.contributions import sum_noise
    one, other = _release(), _release(2.0)
    shared = NoiseDescription(xty=(NoiseTerm("discrete_laplace", 1.5, 3, grid=0.25, share=4),))
    for d in (one, other, shared, one + other):
        assert d.repeated(1) == d
        assert d.repeated(7) == sum([d] * 6, d)
    # Interleaved descriptions, in any order: the same as adding them one by one.
    mix = [one, other, one, shared, one, other, EXACT]
    one_by_one = EXACT
    for d in mix:
        one_by_one = one_by_one + d
    assert sum_noise(mix) == one_by_one == sum_noise(mix[::-1])
    assert sum_noise([one, None, other]) is None and sum_noise([]) == EXACT
    for bad in (0, -1, 2.0, True):
        with pytest.raises(NoiseError):
            one.repeated(bad)


def test_exact_adds_nothing_and_different_scales_stay_separate():
    one = _release()
    assert one + EXACT == one
    mixed = one + _release(2.0)
    assert len(mixed.xty) == 2
    assert mixed.variance("xty") == pytest.approx(2 * 1 + 2 * 4)


def test_statistics_sum_tracks_noise_and_unknown_is_contagious():
    rng = np.random.default_rng(0)
    pub = exact_statistics(rng.normal(size=(5, 3)), rng.normal(size=5))
    assert pub.is_exact
    noisy = pub.with_noise(_release())
    assert (pub + noisy).noise == _release()
    unknown = Statistics(pub.xtx, pub.xty, pub.yty, pub.n)  # default: unknown
    assert unknown.noise is None and not unknown.is_exact
    assert (unknown + pub).noise is None
    # The encoding carries values only: decoding gives unknown unless told.
    assert Statistics.from_bytes(pub.to_bytes()).noise is None
    assert Statistics.from_bytes(pub.to_bytes(), EXACT).is_exact


def test_discrete_laplace_variance_tends_to_the_continuous_one():
    fine = NoiseTerm("discrete_laplace", 2.0, 1, grid=1e-4)
    assert fine.variance() == pytest.approx(8.0, rel=1e-6)
    coarse = NoiseTerm("discrete_laplace", 1.0, 1, grid=1.0)  # geometric, p = e^-1
    q = math.exp(-1)
    assert coarse.variance() == pytest.approx(2 * q / (1 - q) ** 2)


@pytest.mark.parametrize("bad", [dict(law="cauchy", scale=1.0), dict(law="laplace", scale=0.0),
                                 dict(law="laplace", scale=float("nan")),
                                 dict(law="laplace", scale=1.0, draws=0),
                                 dict(law="laplace", scale=1.0, grid=0.5),
                                 dict(law="discrete_laplace", scale=1.0)])
def test_malformed_terms_are_rejected(bad):
    with pytest.raises(NoiseError):
        NoiseTerm(**bad)


def test_proto_and_dict_round_trips():
    d = _release() + _release(3.0)
    assert from_proto(to_proto(d)) == d
    assert NoiseDescription.from_dict(d.to_dict()) == d
    with pytest.raises(NoiseError):
        NoiseDescription.from_dict({"xtx": [], "xyt": []})


def test_skellam_term_variance_and_shares():
    """A skellam term's scale is the sd of one full draw (sqrt(2 lam) grid): C shares of
    threshold T carry C/T of its variance; it needs a grid, like discrete_laplace."""
    lam, grid = 12.5, 0.25
    full = NoiseTerm("skellam", math.sqrt(2 * lam) * grid, 1, grid=grid)
    assert full.variance() == pytest.approx(2 * lam * grid ** 2, rel=1e-12)
    shares = NoiseTerm("skellam", full.scale, 7, grid=grid, share=5)
    assert shares.variance() == pytest.approx(7 / 5 * 2 * lam * grid ** 2, rel=1e-12)
    assert shares.full_draws == pytest.approx(1.4)
    with pytest.raises(NoiseError):
        NoiseTerm("skellam", 1.0, 1)                     # no grid
    with pytest.raises(NoiseError):
        NoiseTerm("gaussian", 1.0, 2, share=2)           # shares only for grid laws
    d = NoiseDescription(xty=(shares,))
    assert from_proto(to_proto(d)) == d
    assert NoiseDescription.from_dict(d.to_dict()) == d
