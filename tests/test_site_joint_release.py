"""The site's joint release (issue 23 parts 2-3; site_node.joint_release) and the node answering
a joint spec: exact statistics at a huge budget (clipping, the row-norm ball, missing
responses), the law and scale of the Gaussian and Laplace noise by goodness of fit on many
draws over exact zero data (each test shown to reject a scale 5 % off), fail-closed checks
before any draw, and SiteNode.handle_round on joint specs: refusals with clear reasons, a
Gaussian round under a pure-eps budget, the stored bytes on a retry and after a crash.

The noise is OpenDP's CSPRNG, so nothing is seeded: the statistical tests are set to a
false-failure probability of about 1e-6 each (tests/test_gaussian_mechanism.py's pattern)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats

from dpfed.accounting import Gaussian, PureDP
from dpfed.joint_noise import calibration_from_spec, joint_calibration
from dpfed.joint_statistics import JointStatistics, joint_exact_statistics
from dpfed.noise import from_proto
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.canonical import parse_canonical
from site_node import joint_release
from site_node.config import load_config
from site_node.joint_release import joint_clipped_statistics, release_joint_statistics
from site_node.ledger import PrivacyLedger
from site_node.node import SiteNode
from tests.test_site_node import make_spec, write_site

ALPHA = 1e-6
Z = stats.norm.isf(ALPHA / 2)          # ~4.9



# The split these tests were written for: the law and scale tests need every part's noise
# comparable (the default split, dpfed.joint_noise.JOINT_DEFAULT_SPLIT, gives Sxx and the
# counts small shares for many targets).
_SPLIT = (0.30, 0.60, 0.05, 0.05)


def _calibration(*args, **kwargs):
    kwargs.setdefault("budget_split", _SPLIT)
    return joint_calibration(*args, **kwargs)

def _data(n=3000, d=4, m=6, missing=0.3, seed=1):
    rng = np.random.default_rng(seed)   # synthetic data, never noise
    x = 2.0 * rng.normal(size=(n, d))
    y = 3.0 * rng.normal(size=(n, m))
    y[rng.random((n, m)) < missing] = np.nan
    y[:, 0] = np.nan                    # a target nobody has
    return x, y


# -- exactness ----------------------------------------------------------------------------

@pytest.mark.parametrize("norm", [None, 1.0])
def test_the_clipped_pass_is_joint_exact_statistics(norm):
    x, y = _data()
    ref = joint_exact_statistics(x, y, 1.5, 2.0, norm)
    sxx, n_x, sxy, syy, n_j = joint_clipped_statistics(x, y, 1.5, 2.0, norm)
    np.testing.assert_allclose(sxx, ref.xtx, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(sxy, ref.xty, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(syy, ref.yty, rtol=1e-12, atol=1e-9)
    assert n_x == ref.n_x == x.shape[0] and np.array_equal(n_j, ref.n) and n_j[0] == 0
    assert np.array_equal(sxx, sxx.T)
    # Missing responses are not a reason to drop the row: every row is in Sxx.
    full = joint_exact_statistics(x, np.zeros_like(y), 1.5, 2.0, norm)
    np.testing.assert_allclose(sxx, full.xtx, rtol=1e-12)


@pytest.mark.parametrize("mechanism,epsilon,delta", [("laplace", 1e9, 0.0),
                                                     ("gaussian", 1e7, 1e-6)])
def test_a_huge_budget_releases_the_exact_statistics(mechanism, epsilon, delta):
    x, y = _data()
    cal = _calibration(4, 6, mechanism=mechanism, epsilon=epsilon, delta=delta,
                            x_bound=1.5, y_bound=2.0, x_norm_bound=1.0)
    got, info = release_joint_statistics(x, y, cal, return_info=True)
    ref = joint_exact_statistics(x, y, 1.5, 2.0, 1.0)
    assert isinstance(got, JointStatistics) and got.noise == cal.noise()
    for part in ("xtx", "xty", "yty"):   # within 6 sd of the (tiny) noise
        np.testing.assert_allclose(getattr(got, part), getattr(ref, part), rtol=0,
                                   atol=6 * cal.scales[part] * (1 if delta else 10))
    assert max(cal.scales[p] for p in ("xtx", "xty", "yty")) < 0.01
    assert got.n_x == ref.n_x and np.array_equal(got.n, ref.n)
    assert np.array_equal(got.xtx, got.xtx.T)
    unit = "epsilon" if mechanism == "laplace" else "rho"
    assert info[f"{unit}_certified"] <= info[unit] * (1 + 1e-9)
    assert info[unit] == pytest.approx(epsilon if mechanism == "laplace" else cal.rho)
    for p in ("xtx", "xty", "yty", "n"):
        assert info["scales"][p] == pytest.approx(cal.scales[p], rel=1e-7)


# -- the noise law and scale -----------------------------------------------------------------

def _chi2(e, cdf, n_bins=30):
    """Chi-square of ``e`` against a continuous law (``cdf``) on equal-probability bins."""
    qs = np.linspace(0, 1, n_bins + 1)[1:-1]
    grid = np.linspace(-50, 50, 200001)
    edges = np.interp(qs, cdf(grid), grid)
    observed = np.bincount(np.searchsorted(edges, e), minlength=n_bins)
    expected = e.size / n_bins
    return float(np.sum((observed - expected) ** 2 / expected)), stats.chi2.isf(ALPHA, n_bins - 1)


def _variance_z(e, target_var):
    """z of the sample second moment of ``e`` (mean 0 known) against ``target_var``."""
    s = e * e
    return (s.mean() - target_var) / (s.std() / math.sqrt(e.size))


def _zero_releases(cal, n, d, m, k):
    """k releases of exact zero data with every response present (so n_x = n_j = n): the
    noise of each part, stacked, and the counts."""
    x = np.zeros((n, d))
    y = np.zeros((n, m))
    parts = {"xtx": [], "xty": [], "yty": [], "n": []}
    iu = np.triu_indices(d)
    for _ in range(k):
        s = release_joint_statistics(x, y, cal)
        parts["xtx"].append(s.xtx[iu])
        parts["xty"].append(s.xty.ravel())
        parts["yty"].append(s.yty)
        parts["n"].append(np.concatenate([[s.n_x], s.n]) - n)
    return {p: np.concatenate(v).astype(np.float64) for p, v in parts.items()}


def test_the_joint_gaussian_noise_has_its_law_and_scale():
    d, m, n = 12, 400, 4000
    cal = _calibration(d, m, mechanism="gaussian", epsilon=2.0, delta=1e-6, x_bound=1.0,
                            y_bound=2.0)
    e = _zero_releases(cal, n, d, m, 6)
    assert all(cal.scales["n"] * 6 < n for _ in [0])          # counts never reach the clamp
    # The pooled standardised noise of the real parts (~30 000 draws) is N(0, 1) ...
    z = np.concatenate([e[p] / cal.scales[p] for p in ("xtx", "xty", "yty")])
    chi2, crit = _chi2(z, stats.norm.cdf)
    assert chi2 < crit, (chi2, crit)
    assert abs(z.mean()) * math.sqrt(z.size) < Z
    assert abs(_variance_z(z, 1.0)) < Z
    # ... and the same draws reject a scale 5 % off either way (variance 10 % off).
    for wrong in (1.05, 0.95):
        assert abs(_variance_z(z, wrong ** 2)) > Z
    # Each part on its own has its own sigma (no part swapped with another's).
    for p in ("xtx", "xty", "yty"):
        assert abs(_variance_z(e[p], cal.scales[p] ** 2)) < Z
    assert abs(_variance_z(e["xty"], (1.05 * cal.scales["xty"]) ** 2)) > Z
    # Counts: integers (rounded Gaussian), variance sigma^2 + 1/12.
    assert np.all(e["n"] == np.rint(e["n"]))
    assert abs(_variance_z(e["n"], cal.scales["n"] ** 2 + 1 / 12)) < Z


def test_the_joint_laplace_noise_has_its_law_and_scale():
    d, m, n = 12, 400, 4000
    cal = _calibration(d, m, mechanism="laplace", epsilon=50.0, x_bound=1.0, y_bound=2.0)
    # 16 releases (~84,000 draws): with 6 (~32,000) the chi-square's power against a Laplace
    # 5 % off was ~0.8 (it passed a wrong scale in 42 of 200 simulated runs; 0 of 200 at 16).
    e = _zero_releases(cal, n, d, m, 16)
    assert cal.scales["n"] * 15 < n
    z = np.concatenate([e[p] / cal.scales[p] for p in ("xtx", "xty", "yty")])
    chi2, crit = _chi2(z, stats.laplace.cdf)
    assert chi2 < crit, (chi2, crit)
    assert abs(_variance_z(z, 2.0)) < Z                        # Laplace(1): variance 2
    for wrong in (1.05, 0.95):
        assert abs(_variance_z(z, 2.0 * wrong ** 2)) > Z
        # the chi-square against a Laplace 5 % off is also rejected at this size
        assert _chi2(z, lambda t, w=wrong: stats.laplace.cdf(t, scale=w))[0] > crit
    assert abs(_variance_z(e["xty"], 2 * cal.scales["xty"] ** 2)) < Z
    # Counts: discrete Laplace of scale s = (1 + m) / eps_n: variance 2 q / (1 - q)^2, q = e^-1/s.
    assert np.all(e["n"] == np.rint(e["n"]))
    q = math.exp(-1.0 / cal.scales["n"])
    assert abs(_variance_z(e["n"], 2 * q / (1 - q) ** 2)) < Z


def test_the_count_certificate_is_opendps_at_the_count_vectors_l1_distance():
    """Laplace counts: the whole vector's loss at integer L1 distance 1 + m is (1 + m) times
    OpenDP's certificate at distance 1 (the map is linear), at most eps_n."""
    import opendp.prelude as dp
    dp.enable_features("contrib")
    m, eps_n = 7, 0.4
    meas = dp.m.make_laplace(dp.vector_domain(dp.atom_domain(T="i64"), size=m + 1),
                             dp.l1_distance(T="i64"), scale=(1 + m) / eps_n)
    assert meas.map(1 + m) == pytest.approx((1 + m) * meas.map(1), rel=1e-12)
    assert meas.map(1 + m) <= eps_n * (1 + 1e-12)


# -- fail closed before any draw ------------------------------------------------------------

@pytest.fixture
def no_draw(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("noise was drawn")
    for name in ("add_laplace_noise", "add_count_noise", "add_gaussian_noise"):
        monkeypatch.setattr(joint_release, name, boom)


def test_bad_inputs_are_refused_before_any_noise_is_drawn(no_draw):
    x, y = _data(n=50)
    cal = _calibration(4, 6, mechanism="gaussian", epsilon=1.0, delta=1e-6, x_bound=1.5,
                            y_bound=2.0)
    bad_y = y.copy()
    bad_y[7, 3] = np.inf
    with pytest.raises(ValueError, match="row 7, target 3") as err:
        release_joint_statistics(x, bad_y, cal)
    bad_x = x.copy()
    bad_x[3, 1] = np.nan
    with pytest.raises(ValueError, match="row 3, column 1"):
        release_joint_statistics(bad_x, y, cal)
    with pytest.raises(ValueError, match=r"y must be an \(50, 5\) array"):
        release_joint_statistics(x, y, _calibration(
            4, 5, mechanism="laplace", epsilon=1.0, x_bound=1.5, y_bound=2.0))
    with pytest.raises(ValueError, match="shape"):
        release_joint_statistics(x[:, :3], y, cal)
    # A calibration whose declared scale is not what OpenDP would draw.
    scales = dict(cal.scales, xty=cal.scales["xty"] * 0.9)
    with pytest.raises(ValueError, match="part xty"):
        release_joint_statistics(x, y, dataclasses.replace(cal, scales=scales))
    # A sensitivity below the joint one (eq. J3), with a scale to match it.
    sens = dict(cal.sensitivities, xtx=cal.sensitivities["xtx"] / 2)
    with pytest.raises(ValueError, match="part xtx"):
        release_joint_statistics(x, y, dataclasses.replace(cal, sensitivities=sens))
    lap = _calibration(4, 6, mechanism="laplace", epsilon=1.0, x_bound=1.5, y_bound=2.0)
    with pytest.raises(ValueError, match="L1"):
        release_joint_statistics(x, y, dataclasses.replace(
            lap, sensitivities=dict(lap.sensitivities, xty=1e-3)))
    # Per-part losses summing to more than the total.
    with pytest.raises(ValueError, match="exceed"):
        release_joint_statistics(x, y, dataclasses.replace(
            lap, losses=dict(lap.losses, xty=lap.epsilon)))


# -- the node answers joint specs ---------------------------------------------------------------

DRUGS = ["d1", "d2", "d3"]
JOINT_POLICY = """
max_epsilon_per_round = 2.0
patient_epsilon = 8.0
patient_delta = 1e-5
min_n = 20
"""


def joint_csv(n=120, seed=0) -> str:
    rng = np.random.default_rng(seed)
    rows = ["id,g1,g2,g3,d1,d2,d3"]
    for i in range(n):
        x = rng.normal(size=3)
        ys = [f"{x.sum() + rng.normal():.4f}" if rng.random() > 0.25 else "" for _ in DRUGS]
        if i == 5:
            ys[1] = "n/a"            # a missing response: not a reason to drop the row
        if i == 6:
            ys[2] = "1e999"          # not finite: missing for that target only
        rows.append(f"P{i:04d},{x[0]:.4f},{x[1]:.4f},{x[2]:.4f}," + ",".join(ys))
    rows.append("P9999,,0.1,0.2,1,2,3")   # a missing feature: the row is left out
    return "\n".join(rows) + "\n"


def joint_spec(round_id="j1", mechanism="gaussian", delta=1e-6, **kw) -> pb.RoundSpec:
    targets = [pb.TargetSpec(name=n, y_mean=0.1 * k, y_scale=1.5)
               for k, n in enumerate(kw.pop("drugs", DRUGS))]
    kw.setdefault("target", "")
    return make_spec(round_id, targets=targets, mechanism=mechanism, delta=delta, **kw)


@pytest.fixture
def joint_site(tmp_path):
    config_path, coordinator, site_key = write_site(tmp_path, data_text=joint_csv(),
                                                    policy=JOINT_POLICY)
    return config_path, coordinator


def reason(answer) -> str:
    assert answer.payload_type == "dpfed.v1.Refusal"
    return parse_canonical(answer.payload, "dpfed.v1.Refusal").reason


def contribution(answer) -> pb.Contribution:
    assert answer.payload_type == "dpfed.v1.Contribution", reason(answer)
    return parse_canonical(answer.payload, "dpfed.v1.Contribution")


@pytest.mark.parametrize("mechanism,delta", [("gaussian", 1e-6), ("laplace", 0.0)])
def test_the_node_releases_a_joint_round_and_charges_its_event(joint_site, mechanism, delta):
    config_path, coordinator = joint_site
    node = SiteNode(load_config(config_path))
    spec = joint_spec(mechanism=mechanism, delta=delta)
    envelope = coordinator.sign(spec)
    consent = node.consent(envelope)           # nothing drawn, nothing debited
    assert consent.payload_type == "dpfed.v1.PhaseMessage" and node.ledger.spent == 0
    c = contribution(node.handle_round(envelope))
    cal = calibration_from_spec(spec)
    stats_ = JointStatistics.from_bytes(c.statistics)
    assert (stats_.dim, stats_.targets) == (3, 3) and c.n == stats_.n_x
    assert from_proto(c.noise) == cal.noise()
    assert c.epsilon_spent == pytest.approx(1.0)
    histories = node.ledger.all_patient_histories()
    # 120 patients with features (P9999 has none), each charged the calibration's event.
    assert len(histories) == 120
    want = Gaussian(cal.mu) if mechanism == "gaussian" else PureDP(1.0)
    assert all(h == [want] for h in histories.values())
    # A retry is answered with the stored bytes: no fresh noise, nothing debited.
    again = node.handle_round(envelope)
    assert again.SerializeToString() == node.ledger.get_release("j1").envelope.SerializeToString()
    assert contribution(again).statistics == c.statistics
    assert node.ledger.spent == pytest.approx(1.0)


def test_the_node_uses_every_row_with_features_and_standardises_each_target(joint_site,
                                                                             monkeypatch):
    config_path, coordinator = joint_site
    node = SiteNode(load_config(config_path))
    seen = {}

    def capture(x, y, calibration, **kw):
        seen["x"], seen["y"] = x, y
        return release_joint_statistics(x, y, calibration, **kw)
    monkeypatch.setattr("site_node.node.release_joint_statistics", capture)
    contribution(node.handle_round(coordinator.sign(joint_spec())))
    rows = [r.split(",") for r in joint_csv().strip().split("\n")[1:-1]]
    assert seen["x"].shape == (120, 3) and seen["y"].shape == (120, 3)

    def value(cell, k):
        try:
            v = float(cell)
        except ValueError:
            return np.nan
        return (v - 0.1 * k) / 1.5 if math.isfinite(v) else np.nan
    want = np.array([[value(r[4 + k], k) for k in range(3)] for r in rows])
    np.testing.assert_allclose(seen["y"], want, rtol=1e-12)
    assert np.isnan(seen["y"][5, 1]) and np.isnan(seen["y"][6, 2])
    assert not np.isnan(seen["y"][5, 0]) or rows[5][4] == ""


def test_the_node_refuses_bad_joint_specs_with_clear_reasons(joint_site):
    config_path, coordinator = joint_site
    node = SiteNode(load_config(config_path))
    cases = [
        (joint_spec("a", drugs=["d1", "nope"]), "column(s) not available at the site: 'nope'"),
        (joint_spec("b", neighbouring="replace_one"), "add_remove only"),
        (joint_spec("c", target="d1"), "not `target`"),
        (joint_spec("d", drugs=["d1", "d1"]), "repeats a target"),
        (joint_spec("e", drugs=["d1", "g1"]), "also features"),
        (joint_spec("f", delta=0.0), "0 < delta < 1"),
        (joint_spec("g", mechanism="laplace", delta=1e-6), "must not name a delta"),
        (joint_spec("h", mechanism="cauchy"), "unknown noise mechanism"),
        (joint_spec("i", delta=1e-3), "exceeds the per-patient delta"),
        (joint_spec("j", budget_split=[0.5, 0.5]), "budget_split"),
    ]
    bad_scale = joint_spec("k")
    bad_scale.targets[1].y_scale = 0.0
    cases.append((bad_scale, "y_scale finite and > 0"))
    for spec, want in cases:
        got = reason(node.handle_round(coordinator.sign(spec)))
        assert want in got, (spec.round_id, got)
    assert node.ledger.spent == 0 and node.ledger.releases() == []


def test_a_gaussian_round_is_refused_under_a_pure_epsilon_budget(tmp_path):
    for policy in ("max_epsilon_per_round = 2.0\npatient_epsilon = 4.0\n",
                   "max_epsilon_per_round = 2.0\ntotal_epsilon = 5.0\n"):
        folder = tmp_path / str(abs(hash(policy)))
        folder.mkdir()
        config_path, coordinator, _ = write_site(folder, data_text=joint_csv(),
                                                 policy=policy)
        node = SiteNode(load_config(config_path))
        got = reason(node.handle_round(coordinator.sign(joint_spec())))
        assert "budget is pure eps" in got and "patient_delta" in got
        # consent is refused the same way, at no cost
        assert "budget is pure eps" in reason(node.consent(coordinator.sign(joint_spec("c2"))))
        assert node.ledger.spent == 0
        # the same joint round with Laplace noise is released (eps 2 with 45 % on the counts:
        # discrete Laplace scale 4.4 on the 4 counts; at make_spec's eps 1 and 15 % (scale 27)
        # a noisy n_j of ~90 rows fell below min_n 20 in ~1 of 12 runs)
        contribution(node.handle_round(coordinator.sign(joint_spec(
            "lap", mechanism="laplace", delta=0.0, epsilon=2.0,
            budget_split=[0.20, 0.30, 0.05, 0.45]))))


class _CrashingLedger(PrivacyLedger):
    def _store(self, *args, **kwargs):
        raise RuntimeError("power cut")


def test_a_crash_inside_the_transaction_leaves_nothing_and_a_restart_sends_the_stored_bytes(
        joint_site):
    config_path, coordinator = joint_site
    config = load_config(config_path)
    envelope = coordinator.sign(joint_spec())
    crashing = _CrashingLedger(config.state_db, site_id=config.site_id, patient_epsilon=8.0,
                               patient_delta=1e-5)
    with pytest.raises(RuntimeError, match="power cut"):
        SiteNode(config, ledger=crashing).handle_round(envelope)
    crashing.close()
    node = SiteNode(config)
    assert node.ledger.spent == 0 and node.ledger.all_patient_histories() == {}
    first = node.handle_round(envelope)          # released and stored; then the site dies
    node.ledger.close()
    restarted = SiteNode(config)
    assert restarted.handle_round(envelope).SerializeToString() == first.SerializeToString()
    assert [r.round_id for r in restarted.ledger.unacknowledged()] == ["j1"]


def test_response_columns_parse_exactly_like_a_feature_cell():
    """site_node.data._response_column (the joint round's fast parse of m response columns)
    gives NaN exactly where _number refuses a cell and the same float everywhere else."""
    import math

    from site_node.data import _number, _response_column
    cells = ["1.5", " 2.25 ", "", "NA", "nan", "inf", "-inf", "abc", None, 3, 4.5, True,
             "1e999", "n/a", b"1.5", " -0.0 ", "0x10", "1_000", object()]
    keep = [0, 2, 1, *range(3, len(cells))]
    got = _response_column(cells, keep)
    want = np.array([math.nan if _number(cells[i]) is None else _number(cells[i]) for i in keep])
    assert np.array_equal(got, want, equal_nan=True)
    assert np.isnan(got).sum() == sum(_number(cells[i]) is None for i in keep) > 0


def test_text_response_columns_parse_exactly_like_the_generic_loop():
    """site_node.data._text_response_column (the fast parse of a text file's response
    columns) gives exactly _response_column's values, on columns that take its fast path
    (numbers and empty / "NA" cells only) and on columns that fall back to the loop."""
    import random

    from site_node.data import _response_column, _text_response_column
    rng = random.Random(7)
    fast = ["1.5", " 2.25 ", "", "NA", "nan", "-inf", "1e999", " -0.0 ", "1_000", "+.5",
            "\u00a03", "\u0661\u0662", "Infinity", "-1e-400", "7"]
    slow = [*fast, "n/a", "abc", "0x10", "1\x00", "\ufffd", "1,5", "None", " "]
    for pool in (fast, slow):
        for _ in range(50):
            cells = [rng.choice(pool) for _ in range(rng.randint(0, 30))]
            keep = sorted(rng.sample(range(len(cells)), rng.randint(0, len(cells))))
            if rng.random() < 0.3:
                rng.shuffle(keep)
            got = _text_response_column(cells, keep)
            want = _response_column(cells, keep)
            assert got.dtype == np.float64 and got.shape == (len(keep),)
            assert np.array_equal(got, want, equal_nan=True)
            assert np.array_equal(np.signbit(got), np.signbit(want))


def test_a_text_files_response_block_is_parsed_like_each_column(tmp_path):
    """site_node.data._response_block reads a text file's response cells row by row and
    converts them at once; the values are those of _response_column column by column, on a
    file whose cells all take the fast path and on one with a cell that does not."""
    import random

    from site_node.data import _response_block, _response_column, read_table
    rng = random.Random(11)
    pool = ["1.5", "", "NA", "-2e3", "nan", "inf", "1e999", " 7 ", "0"]
    for odd in ("", "abc"):
        lines = ["id,a,b,c"]
        for k in range(40):
            lines.append(",".join([f"p{k}", *(rng.choice(pool) for _ in range(3))]))
        lines[5] = "p4,1,2," + (odd or "3")
        path = tmp_path / f"t{bool(odd)}.csv"
        path.write_text("\n".join(lines) + "\n")
        table = read_table(path, "csv")
        keep = [i for i in range(table.n_rows) if rng.random() < 0.8]
        got = _response_block(table, ["c", "a"], keep)
        want = np.column_stack([_response_column(table.columns[c], keep) for c in ("c", "a")])
        assert got.shape == (len(keep), 2) and np.array_equal(got, want, equal_nan=True)
