"""Secure JOINT rounds (issue 23 parts 2-3): the grid calibration of the joint vector
(dpfed.secagg.joint_calibration), its distributed noise (Skellam for Gaussian rounds, discrete
Laplace for Laplace rounds) by goodness of fit, the exact integer joint statistics, and the
round end to end over real gRPC.

The samplers draw from os.urandom (nothing seeded): each statistical test is set to a false
failure probability of about 1e-6, and its power is shown on the same samples by a control
whose standard deviation is 5 % off, which must be rejected (tests/test_secagg_skellam.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpfed.accounting import PureDP, Skellam, compose
from dpfed.joint_noise import joint_calibration
from dpfed.joint_statistics import joint_exact_statistics
from dpfed.secagg import fixedpoint as fp
from dpfed.secagg.errors import ParameterError
from dpfed.secagg.joint_calibration import JOINT_PARTS, calibrate_joint, skellam_inflation
from site_node.secure import joint_exact_clipped_statistics

ALPHA = 1e-6
Z = stats.norm.isf(ALPHA / 2)


def _grid(mechanism="gaussian", *, d=3, m=4, eps=1.0, delta=1e-5, k=10, t=4, n_max=500,
          norm=None, split=None):
    cal = joint_calibration(d, m, mechanism=mechanism, epsilon=eps,
                            delta=delta if mechanism == "gaussian" else 0.0, x_bound=0.5,
                            y_bound=2.0, budget_split=split, x_norm_bound=norm)
    return cal, calibrate_joint(cal, n_max=n_max, n_sites=k, noise_threshold=t)


# ---- calibration ----------------------------------------------------------------------------
@pytest.mark.parametrize("eps,delta,m", [(1.0, 1e-5, 1), (1.0, 1e-5, 262), (4.0, 1e-6, 20),
                                         (0.3, 1e-5, 5)])
def test_skellam_calibration_meets_eps_delta_and_is_tight(eps, delta, m):
    """The charged event is (eps, delta)-DP by eq. A2 + A3, and 1 % less noise is not."""
    cal, grid = _grid(eps=eps, delta=delta, m=m, d=10)
    event = grid.event()
    assert isinstance(event, Skellam)
    assert compose([event]).epsilon(delta) <= eps
    unit = {p: grid.grid_noise[p] / grid.kappa for p in JOINT_PARTS}
    less = {p: 0.99 * grid.grid_noise[p] for p in JOINT_PARTS}
    from dpfed.secagg.joint_calibration import _skellam_event
    assert compose([_skellam_event(less, grid.l1, grid.l2)]).epsilon(delta) > eps
    # kappa: Skellam variance over the central Gaussian's on the grid (> 1: A3 is looser
    # than the exact Gaussian profile), here 1.1-1.25
    assert 1.0 < grid.kappa < 1.3
    assert skellam_inflation(unit, grid.l1, grid.l2, eps, delta) == pytest.approx(grid.kappa)
    for p in ("xtx", "xty", "yty"):
        sd_real = grid.sd_grid(p) / grid.scales[p]
        assert sd_real == pytest.approx(math.sqrt(grid.kappa) * cal.scales[p], rel=1e-4)


def test_the_dominating_event_bounds_the_per_part_composition():
    """One Skellam(lam*, l1*, l2*) event is at least the composition of the per-part Skellam
    mechanisms it stands for (module docstring): never under-charged."""
    _, grid = _grid(d=4, m=6)
    per_part = [Skellam(grid.grid_noise[p], grid.l1[p], grid.l2[p]) for p in JOINT_PARTS]
    for delta in (1e-5, 1e-8):
        assert compose([grid.event()]).epsilon(delta) >= compose(per_part).epsilon(delta)


def test_laplace_grid_calibration_is_pure_eps_per_part():
    cal, grid = _grid("laplace", m=5)
    assert grid.event() == PureDP(1.0)
    assert sum(cal.losses.values()) == pytest.approx(1.0)
    for p in JOINT_PARTS:
        assert grid.grid_noise[p] == pytest.approx(grid.l1[p] / cal.losses[p])
        # the grid sensitivity covers the real one times the scale plus one unit per entry
        assert grid.l1[p] >= cal.sensitivities[p] * grid.scales[p]
    assert grid.l1["n"] == 1 + 5


def test_grid_sensitivity_covers_every_row_after_rounding():
    """For random rows (and the extreme ones) the change of one site's ENCODED statistics
    when a row is added is within the grid L1 / L2 sensitivities of every part."""
    _, grid = _grid(d=3, m=4)
    rng = np.random.default_rng(5)
    sl = grid.layout.slices()
    parts = {"xtx": [sl["xtx"]], "xty": [sl["xty"]], "yty": [sl["yty"]],
             "n": [sl["n_x"], sl["n"]]}
    x = rng.uniform(-0.5, 0.5, (30, 3))
    y = rng.uniform(-2, 2, (30, 4))
    y[rng.random((30, 4)) < 0.3] = np.nan
    base = joint_exact_clipped_statistics(x, y, 0.5, 2.0)
    extra = [(np.full(3, 0.5), np.full(4, 2.0)), (np.array([0.5, 0.0, 0.0]), np.full(4, -2.0))]
    extra += [(rng.uniform(-0.6, 0.6, 3), rng.uniform(-3, 3, 4)) for _ in range(20)]
    a = fp.to_signed(grid.encode_exact(base)).astype(np.float64)
    for v, w in extra:
        more = joint_exact_clipped_statistics(np.vstack([x, v]), np.vstack([y, w]), 0.5, 2.0)
        diff = fp.to_signed(grid.encode_exact(more)).astype(np.float64) - a
        for p, slices in parts.items():
            block = np.concatenate([diff[s] for s in slices])
            assert np.abs(block).sum() <= grid.l1[p]
            assert math.sqrt((block ** 2).sum()) <= grid.l2[p] + 1e-9


def test_exact_joint_statistics_match_the_float_ones_within_quantisation():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(200, 3))
    y = rng.normal(size=(200, 4)) * 1.5
    y[rng.random((200, 4)) < 0.2] = np.nan
    exact = joint_exact_clipped_statistics(x, y, 0.5, 2.0, 0.8)
    ref = joint_exact_statistics(x, y, 0.5, 2.0, 0.8).to_vector()
    got = exact.values()
    assert exact.n_x == 200 and list(exact.n) == list((~np.isnan(y)).sum(axis=0))
    np.testing.assert_allclose(got, ref, rtol=0, atol=200 * 4 * 2.0 ** -19 * 4)
    _, grid = _grid(d=3, m=4, norm=0.8)
    decoded = grid.decode(grid.encode_exact(exact))
    np.testing.assert_allclose(decoded, got, rtol=0, atol=1.0 / min(grid.scales.values()))


def test_infeasible_or_malformed_joint_grids_are_refused():
    cal, _ = _grid()
    with pytest.raises(ParameterError):
        calibrate_joint(cal, n_max=500, n_sites=3, noise_threshold=4)
    with pytest.raises(ParameterError):
        calibrate_joint(cal, n_max=10 ** 18, n_sites=10, noise_threshold=4)
    _, grid = _grid(m=2)
    with pytest.raises(ParameterError):
        grid.encode_exact(joint_exact_clipped_statistics(np.zeros((2, 3)), np.zeros((2, 3)),
                                                         0.5, 2.0))


# ---- the distributed noise of the joint vector ----------------------------------------------
def _chi2_skellam(x, lam, law_lam):
    """Chi-square of x against Sk(law_lam) on 30 bins. Above lam = 1e8 (the real parts' lam,
    ~1e11 grid units^2, where SciPy's Skellam cdf does not converge) the law's cdf is the
    normal N(0, 2 law_lam) with continuity correction: Sk(lam) is symmetric with excess
    kurtosis 1/(2 lam), so the two cdfs differ by O(1/lam) ~ 1e-11, far below what 1e5
    samples resolve."""
    edges = np.unique(np.floor(stats.norm.ppf(np.linspace(0, 1, 31)[1:-1])
                               * math.sqrt(2 * lam)).astype(np.int64))
    observed = np.bincount(np.searchsorted(edges, x, side="left"), minlength=len(edges) + 1)
    if law_lam > 1e8:
        cdf = stats.norm.cdf((edges + 0.5) / math.sqrt(2 * law_lam))
    else:
        cdf = stats.skellam(law_lam, law_lam).cdf(edges)
    expected = np.diff(np.concatenate([[0.0], cdf, [1.0]])) * x.size
    return float(np.sum((observed - expected) ** 2 / expected)), \
        stats.chi2.isf(ALPHA, len(expected) - 1)


def _variance_z(x, target):
    c = x - x.mean()
    return (np.mean(c * c) - target) / (np.std(c * c) / math.sqrt(x.size))


def _check(x, lam, chi2=True):
    """x ~ Sk(lam) (chi-square and variance) and 5 % off rejected."""
    assert abs(_variance_z(x, 2 * lam)) < Z
    if chi2:
        value, crit = _chi2_skellam(x, lam, lam)
        assert value < crit, (value, crit)
    for f in (1.05 ** 2, 0.95 ** 2):
        rejected = abs(_variance_z(x, 2 * f * lam)) > Z
        if chi2 and not rejected:
            rejected = _chi2_skellam(x, lam, f * lam)[0] > _chi2_skellam(x, lam, lam)[1]
        assert rejected, f


@pytest.mark.parametrize("shares", ["one", "T"])
def test_joint_vector_noise_is_skellam_of_the_declared_scale(shares):
    """The noise ``release_exact`` adds (``noise_shares``): one share per entry of part p is
    Sk(lam_p / T), the sum of T shares Sk(lam_p); its variance in real units is what the
    declared NoiseDescription says (one share: ``noise_description(1)``, T: of T)."""
    _, grid = _grid(d=2, m=3, t=4, eps=1.0)
    t = grid.noise_threshold
    rows = 30000
    k = 1 if shares == "one" else t
    draws = sum(grid.noise_shares(rows) for _ in range(k)).astype(np.float64)
    declared = grid.noise_description(k)
    for name, sl in grid.layout.slices().items():
        part = "n" if name in ("n_x", "n") else name
        x = draws[:, sl].ravel()
        lam = grid.grid_noise[part] * k / t
        _check(x, lam)
        s = grid.scales[part]
        assert declared.variance(part) == pytest.approx(2 * lam / s ** 2, rel=1e-12)


def test_joint_vector_noise_laplace_shares_sum_to_the_declared_variance():
    from dpfed.secagg.dlaplace import dl_variance
    _, grid = _grid("laplace", d=2, m=3, t=3)
    # 80000 draws: a Laplace sum's c^2 has relative sd sqrt(5), so 5 % off in sd (10.25 % in
    # variance) lies 0.1025 sqrt(n / 5) = 13 sd out, against 6.5 at 20000, which the power
    # check below missed about one run in 17 (CI, 28 Nov).
    total = sum(grid.noise_shares(80000) for _ in range(3)).astype(np.float64)
    declared = grid.noise_description(3)
    for name, sl in grid.layout.slices().items():
        part = "n" if name in ("n_x", "n") else name
        x = total[:, sl].ravel()
        target = dl_variance(grid.grid_noise[part])
        assert abs(_variance_z(x, target)) < Z
        assert abs(_variance_z(x, 1.05 ** 2 * target)) > Z
        assert declared.variance(part) == pytest.approx(target / grid.scales[part] ** 2,
                                                        rel=1e-9)


# ---- end to end over gRPC --------------------------------------------------------------------
JOINT_TARGETS = ["d1", "d2", "d3"]
#: A Gaussian round needs an (eps, delta) per-patient budget at the site (site_node.policy).
GAUSSIAN_POLICY = {"patient_epsilon": 4.0, "patient_delta": 1e-5}


def _write_joint_data(fed, missing=0.25):
    """Each site's csv with the features of tests/secure_federation and 3 responses, a
    quarter of the cells empty (missing); returns site -> (x, y with NaN)."""
    from tests.secure_federation import FEATURES
    out = {}
    for i, s in enumerate(fed.sites):
        rng = np.random.default_rng(100 + i)
        n = 60 + 7 * i
        x = np.round(rng.normal(size=(n, len(FEATURES))), 4)
        y = np.round(x.sum(axis=1)[:, None] * np.array([1.0, -0.5, 0.2])
                     + rng.normal(size=(n, 3)), 4)
        y[rng.random(y.shape) < missing] = np.nan
        lines = ["id," + ",".join(FEATURES + JOINT_TARGETS)]
        for k in range(n):
            cells = [f"{v:.4f}" for v in x[k]] + ["" if math.isnan(v) else f"{v:.4f}"
                                                  for v in y[k]]
            lines.append(f"{s}-{k}," + ",".join(cells))
        (fed.tmp / f"{s}.csv").write_text("\n".join(lines) + "\n")
        out[s] = (x, y)
    return out


def joint_spec(fed, mechanism, round_id="joint-1", **kw):
    from dpfed.v1 import dpfed_pb2 as pb
    fields = dict(target="", targets=[pb.TargetSpec(name=t, y_mean=0.0, y_scale=1.0)
                                      for t in JOINT_TARGETS],
                  mechanism=mechanism, delta=1e-5 if mechanism == "gaussian" else 0.0,
                  budget_split=[0.30, 0.60, 0.05, 0.05],
                  preprocessing=pb.Preprocessing(x_mean=[0.0] * 3, y_mean=0.0,
                                                 normalize_rows=False))
    fields.update(kw)
    return fed.spec(round_id, **fields)


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_secure_joint_round_over_grpc(tmp_path, mechanism):
    """A joint secure round of 5 sites (T = 3) finishes; the unmasked sum is exactly the sum of
    the sites' inputs, its noise-free part decodes to the exact joint statistics of all the
    sites' clipped rows (within the quantisation), the noise is within its declared tails,
    the aggregator's JointStatistics carries the declared law (C = 5 shares of 1/3 draw),
    and every site's ledger charged the round's event (Skellam for Gaussian rounds), also
    per patient."""
    from dpfed.v1 import dpfed_pb2 as pb
    from site_node.ledger import PrivacyLedger
    from tests.secure_federation import EPSILON, SecureFed
    extra = {"patient_epsilon": 4.0}
    if mechanism == "gaussian":
        extra["patient_delta"] = 1e-5
    fed = SecureFed(tmp_path, 5, policy_extra=extra)
    data = _write_joint_data(fed)
    fed.start_aggregator()
    try:
        seen = {}
        for s in fed.sites:
            def hook(round_id, encoded, vector, s=s):
                seen[s] = (np.array(encoded, dtype=np.uint64), np.array(vector, dtype=np.uint64))
            fed.node(s).secure.on_release = hook
        fed.start_clients()
        coordinator = fed.coordinator()
        coordinator.start_round(joint_spec(fed, mechanism, t=3, quorum=3))
        status = coordinator.wait("joint-1", 60, poll_s=0.05)
        assert status.state == pb.RoundStatus.DONE, status.message
        live = fed.manager.context.rounds["joint-1"]
        grid = live.secure.calibration
        assert live.secure.joint and grid.mechanism == mechanism
        result = live.session.result
        assert result.included == tuple(fed.sites) and sorted(seen) == fed.sites
        total_input = fp.wrap_sum([x for _, x in seen.values()])
        assert np.array_equal(result.vector, total_input)
        clean = fp.wrap_sum([e for e, _ in seen.values()])
        x = np.vstack([data[s][0] for s in fed.sites])
        y = np.vstack([data[s][1] for s in fed.sites])
        exact = joint_exact_statistics(x, y, 0.5, 2.0).to_vector()
        # quantisation (2^-20 of the bounds per value) and one rounding per site and entry
        np.testing.assert_allclose(grid.decode(clean), exact, rtol=0,
                                   atol=x.shape[0] * 4 * 2.0 ** -19 + 5.0 / min(
                                       grid.scales.values()))
        noise = fp.to_signed(total_input - clean).astype(np.float64)
        sd = grid.per_entry({p: grid.sd_grid(p) for p in JOINT_PARTS})
        assert np.any(noise != 0) and np.all(np.abs(noise) < 8 * sd * math.sqrt(5 / 3) + 1)
        private = fed.manager.aggregated_statistics("joint-1")
        counts = grid.decode(total_input)
        sl = grid.layout.slices()
        for part in ("n_x", "n"):   # counts clamped at 0 (post-processing)
            counts[sl[part]] = np.maximum(counts[sl[part]], 0.0)
        np.testing.assert_allclose(private.to_vector(), counts, rtol=0, atol=1e-9)
        declared = grid.noise_description(5)
        assert private.noise == declared
        law = "skellam" if mechanism == "gaussian" else "discrete_laplace"
        assert private.noise.xty[0].law == law and private.noise.full_draws("xty") == \
            pytest.approx(5 / 3)
        event = grid.event()
        for s in fed.sites:
            with PrivacyLedger(fed.ledger_path(s)) as ledger:
                assert ledger.spent == pytest.approx(EPSILON)
                histories = ledger.all_patient_histories()
                assert len(histories) == data[s][0].shape[0]
                assert all(h == [event] for h in histories.values())
    finally:
        fed.stop()


def test_isolation_attack_on_a_joint_round_reveals_nothing(tmp_path, caplog):
    """method.md section 12 on a joint Gaussian round: the aggregator shows site u "only you
    survived" and every other site "u and you": no site signs, no unmask share is released,
    the round fails saying why, and each site was charged once (its stored release)."""
    import logging
    from dpfed.v1 import dpfed_pb2 as pb
    from tests.secure_federation import EPSILON, SecureFed, SiteDriver, notice_phase, wait_state
    from tests.test_secure_round_lying import _rewritten
    fed = SecureFed(tmp_path, 5, policy_extra=GAUSSIAN_POLICY)
    _write_joint_data(fed)
    fed.start_aggregator()
    drivers = {}
    try:
        drivers = {s: SiteDriver(fed, s) for s in fed.sites}
        fed.coordinator().start_round(joint_spec(fed, "gaussian", "sec-1", t=3, quorum=3,
                                                 deadline_s=30))
        released = {}
        for phase in ("consent", "keys", "share_keys", "release"):
            for s, d in drivers.items():
                got, answer, _ = d.step()
                assert got == phase and answer.payload_type != "dpfed.v1.Refusal"
                if phase == "release":
                    released[s] = answer.payload
        pushed = {s: d.next() for s, d in drivers.items()}
        assert {notice_phase(p) for p in pushed.values()} == {"confirm"}
        u = fed.sites[0]
        views = {u: {u}} | {w: {u, w} for w in fed.sites[1:]}
        with caplog.at_level(logging.ERROR, logger="site_node.secure"):
            answers = {s: drivers[s].answer(_rewritten(pushed[s], views[s], fed.aggregator_key))
                       for s in fed.sites}
        assert answers == {s: None for s in fed.sites}
        assert drivers[u].answer(pushed[u]) is None
        for s in fed.sites:
            ledger = fed.node(s).ledger
            stored = ledger.get_release("sec-1")
            assert ledger.spent == EPSILON and stored is not None
            # the masked release that left the site is the stored one (retries resend it)
            assert stored.envelope.payload == released[s]
        status = wait_state(fed.manager, "sec-1", (pb.RoundStatus.FAILED,), 40)
        assert "confirm step ended" in status.message, status.message
    finally:
        for d in drivers.values():
            d.close()
        fed.stop()


def test_a_joint_masked_input_declaring_other_noise_is_refused(tmp_path):
    """The aggregator takes a joint masked input only with exactly the declared share of the
    spec's Skellam grid noise; the same input declaring the central Gaussian noise (or any
    other law/scale) is rejected, and a repeated release notice gets the stored bytes."""
    from dpfed.joint_noise import calibration_from_spec
    from dpfed.noise import to_proto
    from dpfed.v1 import dpfed_pb2 as pb
    from dpfed.wire.canonical import parse_canonical
    import grpc
    from site_node.messages import new_nonce
    from tests.secure_federation import SecureFed, SiteDriver
    fed = SecureFed(tmp_path, 3, policy_extra=GAUSSIAN_POLICY)
    _write_joint_data(fed)
    fed.start_aggregator()
    drivers = {}
    try:
        drivers = {s: SiteDriver(fed, s) for s in fed.sites}
        spec = joint_spec(fed, "gaussian", "sec-2", t=2, quorum=2, deadline_s=30)
        fed.coordinator().start_round(spec)
        for phase in ("consent", "keys", "share_keys"):
            for d in drivers.values():
                assert d.step()[0] == phase
        d = drivers["site-a"]
        notice = d.next()
        answer = d.answer(notice)
        again = d.answer(notice)   # the aggregator asks again: the same stored release
        c = parse_canonical(answer.payload, "dpfed.v1.Contribution")
        assert parse_canonical(again.payload, "dpfed.v1.Contribution").masked == c.masked
        assert c.noise.xty[0].law == "skellam"
        lying = pb.Contribution()
        lying.CopyFrom(c)
        lying.noise.CopyFrom(to_proto(calibration_from_spec(spec).noise()))
        lying.nonce = new_nonce()
        forged = fed.site_keys["site-a"].sign(lying)
        try:
            reply = d.send(forged)
            refused, message = not reply.accepted, reply.message
        except grpc.RpcError as exc:
            refused, message = True, exc.details()
        assert refused and "noise" in message.lower(), message
        assert d.send(answer).accepted   # the genuine one is taken
        assert fed.node("site-a").ledger.spent == pytest.approx(1.0)
    finally:
        for d in drivers.values():
            d.close()
        fed.stop()


def test_secure_problems_and_build_of_a_joint_spec():
    """A joint secure spec is checked like any secure spec, with the joint grid: feasible at
    GDSC size, refused (with the reason) when no 64-bit grid holds the rows; the RoundConfig's
    vector is the joint layout."""
    from dpfed import secure_round
    from dpfed.v1 import dpfed_pb2 as pb
    sites = [f"s{i}" for i in range(4)]
    spec = pb.RoundSpec(
        round_id="j", feature_names=["a", "b", "c"], epsilon=1.0, x_bound=0.5, y_bound=2.0,
        targets=[pb.TargetSpec(name=t, y_mean=0.0, y_scale=1.0) for t in JOINT_TARGETS],
        mechanism="gaussian", delta=1e-5, budget_split=[0.3, 0.6, 0.05, 0.05], quorum=2,
        aggregation="secure", noise_threshold=2, max_site_rows=1000, sites=sites,
        site_key_ids={s: "k" + s for s in sites}, aggregator_key_id="agg")
    assert secure_round.secure_problems(spec, 4) == []
    built = secure_round.build(spec, sites)
    assert built.joint and built.config.vector_length == 6 + 1 + 9 + 3 + 3
    assert isinstance(built.event(), Skellam)
    assert built.share_noise() == built.calibration.noise_description(1)
    assert built.sum_noise(3) == built.calibration.noise_description(3)
    # the joint grid holds even 4 x 1e9 rows at these bounds (row capacity 3.5e13 at eps 1)
    assert built.calibration.row_capacity() > 4 * 10 ** 9
    bad = pb.RoundSpec()
    bad.CopyFrom(spec)
    bad.delta = 0.0            # a Gaussian round without delta has no calibration
    problems = secure_round.secure_problems(bad, 4)
    assert len(problems) == 1 and "no fixed-point grid" in problems[0], problems
    with pytest.raises(secure_round.SecureRoundError):
        secure_round.build(bad, sites)


def test_a_secure_joint_gaussian_round_fits_every_target(tmp_path):
    """With the fit on: the aggregator fits each target of the decoded Skellam sum (the law
    travels to the noise-aware posterior as variances) and says how the noise was combined."""
    import json
    from dpfed.v1 import dpfed_pb2 as pb
    from tests.secure_federation import SecureFed
    fed = SecureFed(tmp_path, 4, policy_extra=GAUSSIAN_POLICY)
    _write_joint_data(fed)
    fed.start_aggregator(skip_fit=False)
    try:
        fed.start_clients()
        coordinator = fed.coordinator()
        coordinator.start_round(joint_spec(fed, "gaussian", t=2, quorum=2, deadline_s=120))
        status = coordinator.wait("joint-1", 180, poll_s=0.1)
        assert status.state == pb.RoundStatus.DONE, status.message
        summary = json.loads(coordinator.result("joint-1").summary_json)
        assert [t["status"] for t in summary["targets"]] == ["fitted"] * 3
        assert summary["aggregation"] == "secure"
        assert "4 shares of 1/2 draw" in summary["noise"]
    finally:
        fed.stop()


# ---- the single-target secure round tests, re-run on joint Gaussian specs --------------------
def _joint_fed_class():
    from tests.secure_federation import SecureFed

    class JointFed(SecureFed):
        """SecureFed whose sites hold joint data (3 responses, cells missing) and whose
        ``spec`` is a joint Gaussian spec (per-patient (eps, delta) budgets at the sites)."""

        def __init__(self, tmp, n_sites=4, **kw):
            kw["policy_extra"] = {**GAUSSIAN_POLICY, **(kw.get("policy_extra") or {})}
            super().__init__(tmp, n_sites, **kw)
            _write_joint_data(self)

        def spec(self, round_id="sec-1", **kw):
            from dpfed.v1 import dpfed_pb2 as pb
            joint = dict(target="", targets=[pb.TargetSpec(name=t, y_mean=0.0, y_scale=1.0)
                                             for t in JOINT_TARGETS],
                         mechanism="gaussian", delta=1e-5,
                         budget_split=[0.30, 0.60, 0.05, 0.05],
                         preprocessing=pb.Preprocessing(x_mean=[0.0] * 3, y_mean=0.0,
                                                        normalize_rows=False))
            JointFed.specs += 1
            return super().spec(round_id, **{**joint, **kw})
    JointFed.specs = 0
    return JointFed


REUSED = ["test_k_minus_t_dropouts_after_keys_still_give_the_sum_one_more_fails",
          "test_a_round_that_fails_before_its_release_step_costs_no_site_anything",
          "test_aggregator_restart_in_every_step_rebuilds_the_session_by_replay",
          "test_a_site_restarted_before_release_drops_out_and_one_after_release_is_counted",
          "test_the_sum_is_never_unmasked_with_fewer_than_T_plus_c_contributions"]


@pytest.mark.parametrize("name,arg", [(REUSED[0], 2), (REUSED[0], 3), (REUSED[1], None),
                                      (REUSED[2], "release"), (REUSED[2], "unmask"),
                                      (REUSED[3], None), (REUSED[4], None)])
def test_secure_round_guarantees_hold_for_joint_rounds(tmp_path, monkeypatch, name, arg):
    """tests/test_secure_round.py's dropout, no-debit-before-release, aggregator restart
    (replay), site restart (stored release resent, counted once) and T + c floor tests, run
    unchanged on joint Gaussian rounds (their SecureFed replaced by a joint one)."""
    import tests.test_secure_round as single
    joint_fed = _joint_fed_class()
    monkeypatch.setattr(single, "SecureFed", joint_fed)
    test = getattr(single, name)
    if arg is None:
        test(tmp_path)
    elif name == REUSED[0]:
        test(tmp_path, drop=arg)
    else:
        test(tmp_path, restart_in=arg)
    assert joint_fed.specs >= 1     # the rounds it ran were joint


@pytest.mark.parametrize("name", [
    "test_forged_replayed_and_out_of_phase_messages_are_rejected_in_every_step",
    "test_a_site_refuses_relayed_identity_keys_the_coordinator_did_not_sign"])
def test_secure_round_rejections_hold_for_joint_rounds(tmp_path, name):
    import tests.test_secure_round as single
    joint_fed = _joint_fed_class()
    fed = joint_fed(tmp_path, 4)
    fed.start_aggregator()
    try:
        getattr(single, name)(fed)
        assert joint_fed.specs >= 1 and fed.manager.context.rounds["sec-1"].secure.joint
    finally:
        fed.stop()


def test_fewer_than_T_honest_skellam_shares_degrade_gracefully():
    """method.md 12 'what a lone masked input is worth', for Skellam: k < T honest shares are
    Sk(k lam / T), whose (eps, delta) the same accountant computes; it falls with k to the
    round's eps at k = T (d = 10, m = 262, eps 1, delta 1e-5, T = 5: a lone share 2.42)."""
    cal, grid = _grid(d=10, m=262, eps=1.0, delta=1e-5, k=10, t=5, n_max=1000)
    e = grid.event()
    eps = [compose([Skellam(e.lam * k / 5, e.l1, e.l2)]).epsilon(1e-5) for k in range(1, 6)]
    assert all(a > b for a, b in zip(eps, eps[1:]))
    assert eps[-1] <= 1.0 and 2.0 < eps[0] < 3.0
