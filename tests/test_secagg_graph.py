"""dpfed.secagg.graph: the SecAgg+ neighbour graph and its parameters."""

import math
import random

import pytest

from dpfed.secagg.errors import ParameterError
from dpfed.secagg.graph import NeighbourGraph, choose_graph_parameters
from dpfed.secagg.protocol import RoundConfig


def _ids(K):
    return tuple(f"site-{i:05d}" for i in range(K))


@pytest.mark.parametrize("K,k", [(20, 4), (100, 30), (1000, 98)])
def test_harary_graph_is_k_regular_symmetric_and_connected(K, k):
    g = NeighbourGraph(_ids(K), k, b"seed")
    for s in g.site_ids:
        nb = g.neighbours(s)
        assert len(nb) == k and s not in nb
        assert all(g.are_neighbours(v, s) for v in nb)
        assert g.holders(s) == tuple(sorted((*nb, s)))
    assert len(g.edges()) == K * k // 2
    assert g.is_connected()


def test_graph_is_deterministic_for_a_round_and_differs_between_rounds():
    ids = _ids(200)
    a = RoundConfig("round-1", ids, 10, 30, 21, 100, 9)
    b = RoundConfig("round-1", ids, 10, 30, 21, 100, 9)
    c = RoundConfig("round-2", ids, 10, 30, 21, 100, 9)
    assert a.digest == b.digest and a.graph().edges() == b.graph().edges()
    assert a.graph().edges() != c.graph().edges()
    # With a seed (the signed spec's, dpfed.secure_round.graph_seed) the graph is the seed's:
    # another round id or configuration under the same seed gives the same graph, and only
    # the coordinator, who signs the spec, chooses it.
    seeded = RoundConfig("round-1", ids, 10, 30, 21, 100, 9, seed=b"s" * 32)
    again = RoundConfig("round-2", ids, 10, 30, 21, 100, 8, seed=b"s" * 32)
    other = RoundConfig("round-1", ids, 10, 30, 21, 100, 9, seed=b"t" * 32)
    assert seeded.graph().edges() == again.graph().edges() != other.graph().edges()
    assert seeded.digest != again.digest
    # the relabelling is a real permutation, not the identity ring
    ring = {(ids[i], ids[(i + 1) % 200]) for i in range(200)}
    assert len(ring & a.graph().edges()) < 40


def test_a_sparse_round_needs_T_honest_survivors_among_a_sites_holders():
    """T + c_k must fit in a site's k + 1 holders: an aggregator that drops the k sites around a
    small arc of the ring could otherwise unmask that arc's sum alone."""
    ids = _ids(200)
    with pytest.raises(ParameterError, match="holders of a site"):
        RoundConfig("round-1", ids, 10, 30, 21, 100, 90)
    cfg = RoundConfig("round-1", ids, 10, 30, 21, 100, 25, colluders=20, corrupt_holders=6)
    assert cfg.holder_floor == 31 and cfg.quorum == 111
    with pytest.raises(ParameterError, match="threshold t"):
        RoundConfig("round-1", ids, 10, 30, 6, 100, 9, colluders=20, corrupt_holders=6)


def test_the_threshold_counts_the_specs_colluders():
    """issue 19 item 2: with K = 5 and c = 1 the semi-malicious threshold is
    floor((5 + 1)/2) + 1 = 4 (the default 10 % corrupt fraction gave c = 0 and t = 3)."""
    cfg = RoundConfig.create("r", _ids(5), 4, min_contributors=4, noise_threshold=3,
                             colluders=1)
    assert (cfg.threshold, cfg.colluders, cfg.corrupt_holders, cfg.quorum) == (4, 1, 1, 4)
    assert RoundConfig.create("r", _ids(5), 4, min_contributors=3).threshold == 3


def test_degree_grows_like_log_K():
    ks = {}
    for K in (100, 1000, 10_000, 100_000):
        p = choose_graph_parameters(K, dropout_fraction=0.1, corrupt_fraction=0.1,
                                    adversary="semi_honest")
        assert not p.complete and p.degree % 2 == 0
        assert 2 <= p.threshold <= p.surviving_holders
        ks[K] = p.degree
    ratios = [ks[K] / math.log(K) for K in ks]
    assert max(ratios) / min(ratios) < 2.0          # k / log K roughly constant ...
    assert ks[100_000] < 2 * ks[1000]               # ... so 100x the sites, < 2x the degree
    assert ks[100_000] < 100                        # and nowhere near K


def test_small_federations_use_the_complete_graph():
    p = choose_graph_parameters(10, dropout_fraction=0.3, corrupt_fraction=0.1)
    assert p.complete and p.degree == 9
    # semi-malicious: t = floor((K + c)/2) + 1 = floor(11/2) + 1
    assert p.threshold == 6
    assert choose_graph_parameters(10, adversary="semi_honest").threshold == 2
    with pytest.raises(ParameterError):
        choose_graph_parameters(10, dropout_fraction=0.6, corrupt_fraction=0.1)
    with pytest.raises(ParameterError):
        choose_graph_parameters(1)


def test_semi_malicious_threshold_exceeds_half_the_holders_plus_corrupt():
    for K in (100, 1000):
        p = choose_graph_parameters(K, dropout_fraction=0.1, corrupt_fraction=0.1)
        assert 2 * p.threshold > p.degree + 1 + p.corrupt_holders


def test_honest_survivors_stay_connected_after_random_removals():
    K = 1000
    p = choose_graph_parameters(K, dropout_fraction=0.1, corrupt_fraction=0.1,
                                adversary="semi_honest")
    ids = _ids(K)
    for trial in range(5):
        g = NeighbourGraph(ids, p.degree, f"round-{trial}".encode())
        gone = set(random.sample(ids, 200))       # 10 % corrupt + 10 % dropped
        assert g.is_connected(set(ids) - gone)
        for s in random.sample(sorted(set(ids) - gone), 20):
            corrupt = len(set(g.neighbours(s)) & set(random.sample(ids, 100)))
            assert corrupt <= p.corrupt_holders


def test_bad_graph_arguments_are_refused():
    with pytest.raises(ParameterError):
        NeighbourGraph(("b", "a"), 1, b"")
    with pytest.raises(ParameterError):
        NeighbourGraph(_ids(10), 3, b"")
    with pytest.raises(ParameterError):
        NeighbourGraph(_ids(10), 12, b"")
