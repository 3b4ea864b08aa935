"""dpfed.secagg.masks and keys: what the aggregator sees is uniform on Z_{2^64}; masks cancel;
keys are bound to round, configuration, pair and purpose.

Uniformity is tested on the masked inputs of a real (in-memory) round: chi-square on the top
and the low byte and Kolmogorov-Smirnov on y / 2^64, each at false-failure probability 1e-6
(no seeds: the masks come from the CSPRNG). The controls show the same tests reject what is not
masked, or masked badly."""

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from scipy import stats

from dpfed.secagg import csprng, keys, masks
from dpfed.secagg import fixedpoint as fp
from dpfed.secagg.errors import ForgedMessage, ParameterError
from dpfed.secagg.messages import MaskedInput
from dpfed.secagg.protocol import RoundConfig
from dpfed.secagg.simulate import run_round
from dpfed.wire.signing import SigningKey

ALPHA = 1e-6
L = 20_000


def _byte_chi2(y, shift):
    b = ((np.asarray(y, dtype=np.uint64) >> np.uint64(shift)) & np.uint64(0xFF)).astype(np.int64)
    obs = np.bincount(b, minlength=256)
    exp = y.size / 256
    return float(np.sum((obs - exp) ** 2 / exp))


def looks_uniform(y) -> bool:
    crit = stats.chi2.isf(ALPHA, 255)
    u = np.asarray(y, dtype=np.uint64).astype(np.float64) / 2.0 ** 64
    return (_byte_chi2(y, 56) < crit and _byte_chi2(y, 0) < crit
            and stats.kstest(u, "uniform").pvalue > ALPHA)


@pytest.fixture(scope="module")
def masked_round():
    """Three sites on the complete graph; one sends zeros, one large structured statistics."""
    ids = ("a-zero", "b-large", "c-random")
    cfg = RoundConfig.create("uniform-round", ids, L, min_contributors=3)
    idents = {s: SigningKey.generate() for s in ids}
    rng = np.random.default_rng(11)
    structured = fp.encode(rng.normal(2.0 ** 40, 2.0 ** 30, L), 1.0)     # big, clustered
    x = {"a-zero": np.zeros(L, np.uint64), "b-large": structured,
         "c-random": csprng.random_u64(L)}
    sim = run_round(cfg, x, idents)
    seen = {s: MaskedInput.from_bytes(b).values() for s, b in sim.seen["MASKED_INPUT"].items()}
    return cfg, x, sim, seen


def test_masked_inputs_look_uniform(masked_round):
    _, x, sim, seen = masked_round
    assert not looks_uniform(x["a-zero"]) and not looks_uniform(x["b-large"])   # controls
    for site in ("a-zero", "b-large"):
        assert looks_uniform(seen[site]), site
    assert np.array_equal(sim.result.vector, fp.wrap_sum(x.values()))


def _pair_mask(cfg, sim, me, other):
    seed = keys.mask_seed(sim.sites[me]._keys.s_private, sim.sites[other].advert.s_public,
                          round_id=cfg.round_id, config_digest=cfg.digest, me=me, other=other)
    return masks.pairwise_mask(seed, me, other, L)


def test_the_test_rejects_unmasked_and_badly_masked_vectors(masked_round):
    cfg, x, sim, seen = masked_round
    s = sim.sites
    y = seen["b-large"]
    no_self = y - masks.self_mask(s["b-large"]._seed, L)
    # Self-mask removed (as for a survivor): the pairwise masks still hide x ...
    assert looks_uniform(no_self)
    # ... and so does either one of them alone ...
    one_left = no_self - _pair_mask(cfg, sim, "b-large", "a-zero")
    assert looks_uniform(one_left)
    # ... but with the single remaining neighbour's mask removed too (what an aggregator could
    # do if it obtained both b_u and the s-key of u), x is exposed and the test says so.
    exposed = one_left - _pair_mask(cfg, sim, "b-large", "c-random")
    assert np.array_equal(exposed, x["b-large"])
    assert not looks_uniform(exposed)
    # Pairwise masks cancel in the sum: all inputs minus all self-masks is the plain sum.
    total = fp.wrap_sum(seen.values())
    for site in s.values():
        total -= masks.self_mask(site._seed, L)
    assert np.array_equal(total, fp.wrap_sum(x.values()))
    # Masks with only 32 random bits leave the top byte of x visible.
    weak = x["b-large"] + (csprng.random_u64(L) >> np.uint64(32))
    assert not looks_uniform(weak)
    assert not looks_uniform(x["b-large"] + np.uint64(12345))


def test_masks_cancel_in_the_sum_and_prg_is_deterministic():
    seed = masks.new_self_seed()
    a = masks.pairwise_mask(seed, "u", "v", 100)
    b = masks.pairwise_mask(seed, "v", "u", 100)
    assert not np.any(a + b)                               # +m and -m cancel mod 2^64
    assert np.array_equal(masks.expand(seed, 100), masks.expand(seed, 100))
    assert not np.array_equal(masks.expand(seed, 100, purpose="self"), masks.expand(seed, 100))
    x = csprng.random_u64(50)
    y = masks.mask_input(x, seed, {}, "u")
    assert np.array_equal(y - masks.self_mask(seed, 50), x)
    with pytest.raises(ParameterError):
        masks.pairwise_sign("u", "u")
    with pytest.raises(ParameterError):
        masks.expand(b"short", 10)


def test_key_agreement_is_symmetric_and_bound_to_round_configuration_and_pair():
    u, v, w = (keys.RoundKeys.generate() for _ in range(3))
    kw = {"round_id": "r", "config_digest": b"\x01" * 32}
    suv = keys.mask_seed(u.s_private, v.s_public, me="u", other="v", **kw)
    assert suv == keys.mask_seed(v.s_private, u.s_public, me="v", other="u", **kw)
    assert suv != keys.mask_seed(u.s_private, v.s_public, me="u", other="v",
                                 round_id="r-old", config_digest=kw["config_digest"])
    assert suv != keys.mask_seed(u.s_private, v.s_public, me="u", other="v", round_id="r",
                                 config_digest=b"\x02" * 32)
    assert suv != keys.mask_seed(u.s_private, w.s_public, me="u", other="w", **kw)
    # share keys are directed
    kuv = keys.share_key(u.c_private, v.c_public, sender="u", recipient="v", **kw)
    assert kuv == keys.share_key(v.c_private, u.c_public, sender="u", recipient="v", **kw)
    assert kuv != keys.share_key(v.c_private, u.c_public, sender="v", recipient="u", **kw)


def test_low_order_public_keys_are_refused():
    with pytest.raises(ForgedMessage):
        keys.agree(X25519PrivateKey.generate(), bytes(32), purpose=b"x", round_id="r",
                   config_digest=b"\x00" * 32, first="a", second="b")


def test_self_seed_commitment_binds_the_site_and_round():
    seed = masks.new_self_seed()
    c = masks.commit_self_seed(seed, round_id="r", config_digest=b"\x00" * 32, site_id="a")
    assert c != masks.commit_self_seed(seed, round_id="r", config_digest=b"\x00" * 32,
                                       site_id="b")
    assert c != masks.commit_self_seed(masks.new_self_seed(), round_id="r",
                                       config_digest=b"\x00" * 32, site_id="a")
