"""dpfed.secagg.protocol end to end (in memory): the unmasked sum is exact, dropouts after key
sharing are tolerated up to K - t, one more gives a clear error and no output; SecAgg+ at
K = 100; statistics plus distributed noise decode to the sum with one noise draw."""

import numpy as np
import pytest

from dpfed.secagg import csprng, dlaplace
from dpfed.secagg import fixedpoint as fp
from dpfed.secagg.errors import AbortedRound, MalformedMessage, TooFewSurvivors
from dpfed.secagg.messages import (AdvertisementBundle, KeyAdvertisement, MaskedInput, Phase,
                                   ShareDelivery, ShareKeys, SurvivorList, SurvivorSignature,
                                   UnmaskRequest, UnmaskResponse,
                                   parse)
from dpfed.secagg.protocol import AggregatorSession, RoundConfig, SiteSession
from dpfed.secagg.simulate import run_round
from dpfed.wire.signing import SigningKey


def _setup(K, L, **kw):
    ids = tuple(f"hospital-{i:03d}" for i in range(K))
    kw.setdefault("min_contributors", 2)
    cfg = RoundConfig.create(f"round-{K}-{L}", ids, L, **kw)
    idents = {s: SigningKey.generate() for s in ids}
    x = {s: csprng.random_u64(L) for s in ids}
    return cfg, idents, x


def _expected(x, included):
    return fp.wrap_sum(x[s] for s in included)


def test_exact_sum_without_dropouts():
    cfg, idents, x = _setup(4, 33)
    sim = run_round(cfg, x, idents, aggregator_identity=SigningKey.generate())
    assert sim.result.included == cfg.site_ids and sim.result.dropped == ()
    assert np.array_equal(sim.result.vector, fp.wrap_sum(x.values()))


def test_up_to_K_minus_t_dropouts_after_key_sharing():
    cfg, idents, x = _setup(8, 21)
    t = cfg.threshold
    assert cfg.degree == 7 and t == 5                    # complete graph, semi-malicious
    for n_drop in range(1, len(cfg.site_ids) - t + 1):
        dropped = cfg.site_ids[-n_drop:]
        sim = run_round(cfg, x, idents,
                        drop_before={s: Phase.MASKED_INPUT for s in dropped})
        survivors = tuple(s for s in cfg.site_ids if s not in dropped)
        assert sim.result.included == survivors and sim.result.dropped == dropped
        assert np.array_equal(sim.result.vector, _expected(x, survivors)), n_drop


def test_one_dropout_too_many_fails_clearly_and_reveals_nothing():
    cfg, idents, x = _setup(8, 5)
    dropped = cfg.site_ids[:len(cfg.site_ids) - cfg.threshold + 1]
    public = {s: k.public_key for s, k in idents.items()}
    sites = {s: SiteSession(cfg, s, idents[s], public) for s in cfg.site_ids}
    agg = AggregatorSession(cfg, public)
    for s in sites.values():
        agg.receive(s.advertise().to_bytes())
    bundles = agg.close_advertisements()
    for s, site in sites.items():
        agg.receive(site.share_keys(bundles[s]))
    deliveries = agg.close_share_keys()
    for s, site in sites.items():
        if s not in dropped:
            agg.receive(site.masked_input(deliveries[s], x[s]))
    with pytest.raises(TooFewSurvivors, match="nothing is unmasked"):
        agg.close_masked_inputs()
    assert agg.phase == Phase.FAILED and agg.result is None
    with pytest.raises(AbortedRound):
        agg.finish()
    # no site was ever asked to confirm a survivor set, let alone unmask anything
    assert all(site.phase == Phase.CONSISTENCY for s, site in sites.items() if s not in dropped)


def test_min_contributors_is_enforced_even_when_t_would_allow():
    cfg, idents, x = _setup(6, 5, min_contributors=6, adversary="semi_honest")
    assert cfg.threshold == 2
    with pytest.raises(TooFewSurvivors):
        run_round(cfg, x, idents, drop_before={cfg.site_ids[0]: Phase.MASKED_INPUT})


def test_dropouts_in_every_phase():
    cfg, idents, x = _setup(10, 17, adversary="semi_honest")
    ids = cfg.site_ids
    drop = {ids[0]: Phase.ADVERTISE, ids[1]: Phase.SHARE_KEYS, ids[2]: Phase.MASKED_INPUT,
            ids[3]: Phase.UNMASK}                       # ids[3] sent its input, then vanished
    sim = run_round(cfg, x, idents, drop_before=drop)
    included = ids[3:]
    assert sim.result.included == included and sim.result.dropped == (ids[2],)
    assert sim.aggregator.released == included
    assert np.array_equal(sim.result.vector, _expected(x, included))


def test_secagg_plus_with_100_sites_and_10_percent_dropouts():
    cfg, idents, x = _setup(100, 40, min_contributors=80, noise_threshold=5)
    assert not cfg.graph().complete and cfg.degree < 40
    dropped = cfg.site_ids[::10]
    sim = run_round(cfg, x, idents, drop_before={s: Phase.MASKED_INPUT for s in dropped})
    survivors = tuple(s for s in cfg.site_ids if s not in dropped)
    assert sim.result.included == survivors
    assert np.array_equal(sim.result.vector, _expected(x, survivors))


def test_statistics_plus_distributed_noise_decode_to_the_sum():
    K, d, T = 5, 2, 5
    layout = fp.StatisticsLayout(d)
    cfg, idents, _ = _setup(K, layout.length, min_contributors=T)
    rng = np.random.default_rng(4)
    b_real = {"xtx": 3.0, "xty": 2.0, "yty": 1.0, "n": 4.0}
    scales = fp.choose_scales(d=d, n_max=50, n_sites=K, x_bound=1.0, y_bound=1.0,
                              noise_scales=b_real, noise_threshold=T)
    per_entry_scale = layout.per_entry(scales)
    b_grid = {p: b_real[p] * scales[p] for p in b_real}
    truth, x = np.zeros(layout.length), {}
    for s in cfg.site_ids:
        X = np.clip(rng.normal(size=(50, d)), -1, 1)
        y = np.clip(rng.normal(size=50), -1, 1)
        v = layout.pack(np.concatenate([(X.T @ X)[np.triu_indices(d)], X.T @ y, [y @ y]]), 50)
        truth += v
        share = dlaplace.noise_share(layout.per_entry(b_grid), T)
        x[s] = fp.add_signed(fp.encode(v, per_entry_scale), share)
    sim = run_round(cfg, x, idents)
    released = fp.decode(sim.result.vector, per_entry_scale)
    noise = released - truth
    assert np.all(np.abs(noise) < 40 * layout.per_entry(b_real))
    assert released[-1] == round(released[-1])            # n stays an integer
    desc = dlaplace.describe_sum(b_grid, scales, T, len(sim.result.included))
    assert desc.draws("xty") == 1 and desc.xty[0].law == "discrete_laplace"


def test_every_message_has_one_canonical_encoding():
    cfg, idents, x = _setup(3, 4)
    sim = run_round(cfg, x, idents, aggregator_identity=SigningKey.generate())
    kinds = set()
    for phase, msgs in sim.seen.items():
        for data in msgs.values():
            m = parse(data)
            kinds.add(type(m))
            assert m.to_bytes() == data and type(m).from_bytes(data) == m
            with pytest.raises(MalformedMessage):
                parse(data + b"\x00")
            with pytest.raises(MalformedMessage):
                parse(data[:-1])
    assert kinds == {KeyAdvertisement, ShareKeys, MaskedInput, SurvivorSignature,
                     UnmaskResponse}
    for junk in (b"", b"DSA1", b"XXXX" + bytes(40), b"DSA1\x09\x00"):
        with pytest.raises(MalformedMessage):
            parse(junk)
    with pytest.raises(MalformedMessage):       # a type tag with another phase's byte
        parse(sim.seen["ADVERTISE"][cfg.site_ids[0]][:5] + b"\x02"
              + sim.seen["ADVERTISE"][cfg.site_ids[0]][6:])
    for cls in (AdvertisementBundle, ShareDelivery, SurvivorList, UnmaskRequest):
        assert not cls.FROM_SITE
