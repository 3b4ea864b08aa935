"""Auxiliary data shaped like the public rows, the public-shaped bounds search, and the forecast
(issue 9 parts 3-4; dpfed/auxiliary.py, dpfed/bounds.py, dpfed_apps/forecast.py, dpfed plan)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from dpfed.auxiliary import AuxiliarySource, exclusive_groups
from dpfed.bounds import AUX_OMEGAS, _scales, choose_bounds
from dpfed.metrics import LinearTestRanks, spearman
from dpfed.preprocess import Preprocessing

NAMES = ("A_mut", "B_mut", "C_mut", "tissue=x", "tissue=y", "tissue=z", "age")


def _public(m=10, seed=0, p=(0.6, 0.2, 0.1)):
    rng = np.random.default_rng(seed)
    x = np.zeros((m, len(NAMES)))
    for j, pj in enumerate(p):
        x[:, j] = rng.random(m) < pj
    x[:, 0][:2] = (1, 0)       # every binary column has both values
    tissue = rng.choice(4, size=m, p=(0.3, 0.2, 0.1, 0.4))
    for j in range(3):
        x[:, 3 + j] = tissue == j
    x[:, 6] = rng.normal(60, 10, size=m)
    y = 2.0 + x[:, 0] - 0.5 * x[:, 3] + rng.normal(0, 1.3, size=m)
    return x, y


def _source(m=10, seed=0, row_bootstrap=0.0, **kw):
    x, y = _public(m, seed, **kw)
    return AuxiliarySource(x, y, Preprocessing.from_public_data(x, y), feature_names=NAMES,
                           row_bootstrap=row_bootstrap)


def test_reads_only_what_it_is_given(monkeypatch):
    """No bundled data, no file, no global state: the same inputs and seed give the same rows,
    and the inputs are copied (mutating the caller's arrays afterwards changes nothing)."""
    import dpfed.datasets as ds

    for name in ("load_responses", "load_genomic_features", "drug_dataset", "feature_matrix"):
        monkeypatch.setattr(ds, name, lambda *a, **k: pytest.fail("read bundled data"))
    x, y = _public()
    src = AuxiliarySource(x, y, Preprocessing.from_public_data(x, y), feature_names=NAMES)
    a = src.sample(np.random.default_rng(5), 50, 20)
    x[:] = 0.0
    y[:] = 0.0
    b = src.sample(np.random.default_rng(5), 50, 20)
    for f in ("x", "y", "x_public", "y_public", "x_test", "y_test"):
        assert np.array_equal(getattr(a, f), getattr(b, f))
    other = _source(seed=1).sample(np.random.default_rng(5), 50, 20)
    assert not np.array_equal(a.x, other.x)


def test_column_kinds_and_groups():
    src = _source()
    assert src.groups == ((3, 4, 5),)
    kinds = src.column_kinds()
    assert [kinds[j] for j in range(7)] == ["binary"] * 3 + ["exclusive"] * 3 + ["continuous"]
    # Two tissues set in one public row: not exclusive, plain binary columns.
    x, _ = _public()
    x[0, 3:6] = (1, 1, 0)
    assert exclusive_groups(x, NAMES) == ()


def test_reproduces_public_frequencies():
    """With many public rows the smoothing is negligible: population frequencies match the
    public ones (binary columns and the exclusive group), averaged over populations."""
    src = _source(m=400, seed=3, row_bootstrap=0.5)   # the default mixture keeps frequencies
    xp = src.x_public
    rng = np.random.default_rng(0)
    raw = np.vstack([src.sample_raw_features(rng, 2000) for _ in range(5)])
    freq_pub = xp[:, :6].mean(axis=0)
    freq_aux = raw[:, :6].mean(axis=0)
    assert np.allclose(freq_aux, freq_pub, atol=0.03), (freq_aux, freq_pub)
    assert np.all(raw[:, 3:6].sum(axis=1) <= 1)                     # one tissue at most
    assert set(np.unique(raw[:, :6])) <= {0.0, 1.0}
    assert abs(raw[:, 6].mean() - xp[:, 6].mean()) < 1.0            # continuous: resampled
    assert abs(raw[:, 6].std() - xp[:, 6].std()) < 1.5
    # Ten public rows: smoothed, never 0 or 1 for a column seen only one way.
    small = _source(m=10)
    raw10 = np.vstack([small.sample_raw_features(rng, 500) for _ in range(40)])
    k = small.x_public[:, 2].sum()
    assert abs(raw10[:, 2].mean() - (k + 0.5) / 11) < 0.03


def test_outputs_are_preprocessed():
    src = _source()
    a = src.sample(np.random.default_rng(1), 300, 40)
    for z in (a.x, a.x_public, a.x_test):
        norms = np.linalg.norm(z, axis=1)
        assert np.allclose(norms[norms > 0], 1.0)
    assert a.x.shape == (300, 7) and a.x_test.shape == (40, 7) and a.x_public.shape == (10, 7)
    # y is centred with the *public* mean: near 0, not exactly 0.
    assert abs(a.y.mean()) < 3 * a.sigma_y
    assert 0 < a.r2 < 1 and a.sigma_y > 0


def test_test_scorer_matches_spearman_with_ties():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2, size=(100, 4)).astype(float)
    y = rng.normal(size=100)
    y[:10] = y[10]                                                   # ties in y too
    betas = rng.normal(size=(7, 4))
    got = LinearTestRanks(x, y).spearman_many(betas)
    want = [spearman(x @ b, y) for b in betas]
    assert np.allclose(got, want)


def test_scales_formulas():
    d, eps, bx, by = 10, 2.0, 0.3, 1.5
    b = _scales(d, eps, bx, by, (0.35, 0.60, 0.03, 0.02), "add_remove", "exact")
    assert b == pytest.approx((55 * bx**2 / 0.7, 10 * bx * by / 1.2, by**2 / 0.06, 1 / 0.04))
    b = _scales(d, eps, bx, by, (0.35, 0.60, 0.05), "replace_one", "exact")
    assert b[:3] == pytest.approx((55 * bx**2 / 0.7, 20 * bx * by / 1.2, by**2 / 0.1))
    assert b[3] is None
    assert _scales(d, eps, bx, by, (0.35, 0.60, 0.05), "replace_one", "paper")[0] == \
        pytest.approx(110 * bx**2 / 0.7)
    with pytest.raises(ValueError):
        _scales(d, eps, bx, by, (0.35, 0.60, 0.05), "add_remove", "exact")


SMALL = dict(n_datasets=3, n_noise=3, omegas=(0.2, 0.5, 1.0, 2.0), ridge_cs=(0.0, 4.0))


def test_choose_bounds_public_shaped_is_deterministic_and_in_range():
    src = _source()
    kw = dict(auxiliary=src, neighbouring="add_remove", xtx_sensitivity="exact",
              ridge="noise_matched", search_sxx_share=True, **SMALL)
    a = choose_bounds(200, 7, 1.0, seed=4, **kw)
    choose_bounds.cache_clear()
    b = choose_bounds(200, 7, 1.0, seed=4, **kw)
    assert a == b and a is not b
    c = choose_bounds(200, 7, 1.0, seed=5, **kw)
    assert c.scores != a.scores
    assert a.omega_x in SMALL["omegas"] and a.omega_y in SMALL["omegas"]
    assert a.ridge_c in SMALL["ridge_cs"]
    assert len(a.budget_split) == 4 and sum(a.budget_split) == pytest.approx(1)
    assert a.budget_split[2:] == (0.03, 0.02)
    assert a.auxiliary.startswith("public:") and a.neighbouring == "add_remove"
    assert -1 <= a.best_score <= 1 and a.best_score == np.max(a.scores_array())
    assert a.best_score == max(v for _, v in a.split_scores)
    from dpfed.bounds import BoundsChoice

    assert BoundsChoice.from_json(a.to_json()) == a
    # Replace-one takes a 3-part split; the default grid goes beyond the paper's 2.0.
    r = choose_bounds(200, 7, 1.0, auxiliary=src, n_datasets=2, n_noise=2)
    assert len(r.budget_split) == 3 and r.omegas == AUX_OMEGAS
    with pytest.raises(ValueError):
        choose_bounds(200, 7, 1.0, auxiliary=src, neighbouring="add_remove",
                      budget_split=(0.35, 0.6, 0.05))
    with pytest.raises(ValueError):
        choose_bounds(200, 6, 1.0, auxiliary=src)


def test_choose_bounds_disk_cache_for_public_shaped(tmp_path):
    src = _source()
    kw = dict(auxiliary=src, neighbouring="add_remove", ridge="noise_matched",
              xtx_sensitivity="exact", cache_dir=tmp_path, **SMALL)
    a = choose_bounds(150, 7, 2.0, **kw)
    assert len(list(tmp_path.glob("bounds-*.json"))) == 1
    choose_bounds.cache_clear()
    assert choose_bounds(150, 7, 2.0, **kw) == a


def test_forecast_matches_realised_gain_when_the_model_is_true():
    """Truth known: the 'real' rows are drawn from the auxiliary family itself. The realised
    gain of private + public over public-only (same mechanism, averaged over seeds) lies within
    the forecast's stated single-round interval, and the forecast's mean is close to it."""
    from dpfed_apps.forecast import Mechanism, closed_form_fit, forecast_round, score_cell

    src = _source(m=10, seed=2)
    n, eps, bounds = 400, 2.0, (0.4, 2.5)
    fc = forecast_round(x_public=src.x_public, y_public=src.y_public, feature_names=NAMES,
                        n_per_site=n, epsilons=[eps], bounds=bounds, ridge_c=4.0,
                        n_datasets=30, n_noise=4, seed=11, row_bootstrap=0.0)["per_epsilon"][0]
    mech = Mechanism(eps, *bounds, (0.35, 0.60, 0.03, 0.02), "add_remove", "exact")
    realised = []
    for s in range(30):
        rng = np.random.default_rng(1000 + s)
        data = src.sample(rng, n, 100)
        cell = score_cell(rng, [(data.x, data.y)], data.x_public, data.y_public, data.x_test,
                          data.y_test, mech, closed_form_fit(4.0), 4)
        realised.append(np.mean(cell["private_public"]) - cell["public_only"])
    r = float(np.mean(realised))
    g = fc["gain"]
    assert g["q10"] <= r <= g["q90"]
    # The two means are estimates of the same expectation: within 3 combined standard errors.
    se_r = np.std(realised, ddof=1) / np.sqrt(len(realised))
    assert abs(g["mean"] - r) <= 3 * np.hypot(g["se_mean"], se_r)
    assert fc["spearman_nonprivate"]["mean"] > fc["spearman_public_only"]["mean"]


def test_forecast_gain_grows_with_epsilon_and_custom_fit_is_used():
    from dpfed_apps.forecast import closed_form_fit, forecast_round

    src = _source(m=10, seed=2)
    calls = []
    base = closed_form_fit(4.0)

    def fit(*a):
        calls.append(a[0].shape)
        return base(*a)

    fc = forecast_round(x_public=src.x_public, y_public=src.y_public, feature_names=NAMES,
                        n_per_site=[300, 300], epsilons=[0.05, 50.0], bounds=(0.4, 2.5),
                        n_datasets=12, n_noise=3, seed=1, fit=fit)
    lo, hi = fc["per_epsilon"]
    assert hi["gain"]["mean"] > lo["gain"]["mean"]
    assert calls and all(s[0] == 3 for s in calls)
    assert fc["sites"] == 2 and lo["noise_scales"]["draws"] == 2


def _write_public_csv(path, src):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", *NAMES, "resp"])
        for i, (row, y) in enumerate(zip(src.x_public, src.y_public)):
            w.writerow([f"line{i}", *row.tolist(), y])


def test_plan_cli_json(tmp_path, capsys):
    from dpfed_apps.cli import main

    src = _source()
    path = tmp_path / "public.csv"
    _write_public_csv(path, src)
    rc = main(["plan", "--public", str(path), "--target", "resp", "--n", "120,80",
               "--epsilon", "1,2", "--datasets", "3", "--noise-draws", "2", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("d", "n_public", "n_per_site", "sites", "neighbouring", "xtx_sensitivity", "fit",
                "n_datasets", "n_noise", "n_test", "seed", "auxiliary", "per_epsilon", "notes"):
        assert key in out, key
    assert out["n_per_site"] == [120, 80] and out["d"] == 7 and out["n_public"] == 10
    assert [r["epsilon"] for r in out["per_epsilon"]] == [1.0, 2.0]
    for r in out["per_epsilon"]:
        for key in ("epsilon_per_site", "bounds", "budget_split", "ridge_c", "noise_scales",
                    "spearman_public_only", "spearman_private_public", "spearman_nonprivate",
                    "gain", "gain_expected"):
            assert key in r, key
        assert set(r["gain"]) >= {"mean", "q10", "q90", "p_positive", "se_mean",
                                  "q10_populations", "q90_populations", "band_margins"}
        # The band shown is the populations' widened by the calibrated margins.
        assert r["gain"]["q10"] < r["gain"]["q10_populations"] <= \
            r["gain"]["q90_populations"] < r["gain"]["q90"]
        assert r["gain"]["q10"] <= r["gain"]["mean"] <= r["gain"]["q90"] or \
            r["gain"]["q10"] == r["gain"]["q90"]
        assert r["bounds"]["chosen"] is True
    # Readable table, and a usage error is exit code 2.
    assert main(["plan", "--public", str(path), "--target", "resp", "--n", "100",
                 "--bounds", "0.3,1.0", "--datasets", "2", "--noise-draws", "2"]) == 0
    text = capsys.readouterr().out
    assert "gain mean" in text and "one round's gain on 100 held-out rows" in text
    # --test-rows sets the held-out rows the band is for; fewer than 10 is a usage error.
    assert main(["plan", "--public", str(path), "--target", "resp", "--n", "100", "--json",
                 "--bounds", "0.3,1.0", "--datasets", "2", "--noise-draws", "2",
                 "--test-rows", "300"]) == 0
    assert json.loads(capsys.readouterr().out)["n_test"] == 300
    assert main(["plan", "--public", str(path), "--target", "resp", "--n", "100",
                 "--test-rows", "5"]) == 2
    assert "--test-rows" in capsys.readouterr().err
    assert main(["plan", "--public", str(path), "--target", "nope", "--n", "100"]) == 2
    assert main(["plan", "--public", str(path), "--target", "resp", "--n", "100",
                 "--bounds", "0.3"]) == 2


def test_row_bootstrap_copies_public_rows():
    x, y = _public()
    src = AuxiliarySource(x, y, Preprocessing.from_public_data(x, y), feature_names=NAMES,
                          row_bootstrap=1.0)
    raw = src.sample_raw_features(np.random.default_rng(0), 200)
    public_rows = {tuple(r) for r in x}
    assert all(tuple(r) in public_rows for r in raw)
    with pytest.raises(ValueError):
        AuxiliarySource(x, y, Preprocessing.from_public_data(x, y), row_bootstrap=1.5)


def test_bounds_table_one_search_for_every_cell(tmp_path):
    """dpfed.bounds.choose_bounds_table: every (n, K, eps) at once, deterministic per seed,
    cached; with the row-norm bound the feature bound is R (omega_x = R / sigma_x) and the
    choice is within the grids; bad cells are refused."""
    from dpfed.bounds import TABLE_OMEGAS_Y, TABLE_RIDGE_CS, choose_bounds_table

    src = _source(row_bootstrap=0.5)
    cells = [(100, 1), (300, 1), (300, 3)]
    table = choose_bounds_table(src, cells, (1.0, 2.0), x_norm_bound=1.0, seed=3,
                                cache_dir=tmp_path)
    assert set(table) == {(n, k, e) for n, k in cells for e in (1.0, 2.0)}
    sigma_x, sigma_y = src.scales()
    for (n, k, e), ch in table.items():
        assert (ch.n, ch.sites, ch.epsilon) == (n, k, e)
        assert ch.omega_x == pytest.approx(1.0 / sigma_x) and ch.bounds(sigma_x, sigma_y)[0] == \
            pytest.approx(1.0)
        assert ch.omega_y in TABLE_OMEGAS_Y and ch.ridge_c in TABLE_RIDGE_CS
        assert ch.budget_split[0] in (0.1, 0.2, 0.35) and abs(sum(ch.budget_split) - 1) < 1e-9
        assert len(ch.budget_split) == 4 and ch.x_norm_bound == 1.0
    again = choose_bounds_table(src, cells, (2.0, 1.0), x_norm_bound=1.0, seed=3)
    assert again == table
    assert choose_bounds_table(src, cells, (1.0, 2.0), x_norm_bound=1.0, seed=3,
                               cache_dir=tmp_path) == table
    assert len(list(tmp_path.glob("table-*.json"))) == 1
    box = choose_bounds_table(src, [(300, 1)], (2.0,), seed=3, neighbouring="replace_one")
    assert box[(300, 1, 2.0)].omega_x in (0.3, 1.0, 2.0, 3.2)
    assert len(box[(300, 1, 2.0)].budget_split) == 3
    for bad in ([(1, 1)], [(5, 10)], []):
        with pytest.raises(ValueError):
            choose_bounds_table(src, bad, (1.0,))
    with pytest.raises(ValueError):
        choose_bounds_table(src, cells, (0.0,))


def test_forecast_secure_aggregation_is_one_draw_on_the_total():
    """A secure round's sum carries one noise draw (method.md section 10): the forecast scores
    one release of the total n, and says so; at a small eps that beats K independent draws."""
    from dpfed_apps.forecast import forecast_round

    src = _source(m=10, seed=3)
    common = dict(x_public=src.x_public, y_public=src.y_public, feature_names=NAMES,
                  n_per_site=[60] * 10, epsilons=[0.5], bounds=(0.4, 2.5), ridge_c=4.0,
                  n_datasets=12, n_noise=4, seed=5, row_bootstrap=0.0)
    secure = forecast_round(**common, aggregation="secure")
    independent = forecast_round(**common)
    assert secure["aggregation"] == "secure" and secure["sites"] == 10
    assert secure["per_epsilon"][0]["noise_scales"]["draws"] == 1
    assert independent["per_epsilon"][0]["noise_scales"]["draws"] == 10
    assert (secure["per_epsilon"][0]["gain"]["mean"]
            > independent["per_epsilon"][0]["gain"]["mean"])
    with pytest.raises(ValueError, match="aggregation"):
        forecast_round(**common, aggregation="pooled")
