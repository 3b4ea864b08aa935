"""posterior.quality: how much the private statistics told us, in plain words."""

import numpy as np

from posterior.quality import information_statement, prediction_snr
from dpfed_apps.commands.round import format_result_table
from dpfed_apps.simulation.report import format_report


def _draws(rng, mean, sd, n=4000):
    return rng.standard_normal((n, len(mean))) * sd + np.asarray(mean)


def test_verdicts_follow_the_signal_to_noise_of_predictions():
    rng = np.random.default_rng(0)
    public = _draws(rng, [0.5, 0, 0], 1.0)               # snr about 0.3
    little = information_statement(_draws(rng, [0.6, 0, 0], 0.9), public)
    some = information_statement(_draws(rng, [1.0, 0.5, 0], 0.5), public)
    much = information_statement(_draws(rng, [2.0, -2.0, 1.0], 0.3), public)
    assert [x["verdict"] for x in (little, some, much)] == ["little", "some", "substantial"]
    assert "little information" in little["text"]
    assert little["snr"] < some["snr"] < much["snr"]
    assert 0.9 < little["agreement"] <= 1.0 and much["agreement"] < 0.7


def test_scale_free_so_clipped_coefficients_compare_with_public_ones():
    rng = np.random.default_rng(1)
    draws = _draws(rng, [1.0, -0.5, 0.2], 0.3)
    m = np.array([[1.0, 0.2, 0.0], [0.2, 0.5, 0.1], [0.0, 0.1, 2.0]])
    assert abs(prediction_snr(draws, m) - prediction_snr(10 * draws, m)) < 1e-12
    public = _draws(rng, [0.1, 0, 0], 1.0)
    a = information_statement(draws, public, m)
    b = information_statement(10 * draws, public, m)
    assert abs(a["snr"] - b["snr"]) < 1e-9 and abs(a["agreement"] - b["agreement"]) < 0.05


def test_reports_warn_when_the_private_data_said_little():
    info = information_statement(np.random.default_rng(1).standard_normal((500, 2)),
                                 np.random.default_rng(2).standard_normal((500, 2)))
    assert info["verdict"] == "little"
    summary = {"round_id": "r1", "dim": 2, "n_total": 110, "n_public": 10, "sites": [{}],
               "beta_mean": [0.1, 0.2], "beta_sd": [1, 1], "beta_ci90": [[-1, 1], [-1, 1]],
               "feature_names": ["a", "b"], "model": "noise-aware", "noise": "xty sd 3",
               "information": info}
    table = format_result_table(summary)
    assert "WARNING: The private statistics carried little information" in table
    assert "model noise-aware" in table and "5%" in table
    result = {"round_id": "r1", "data": "x", "sites": [], "n_public": 10, "n_test": 10,
              "features": ["a", "b"], "bounds": {"x_bound": 1, "y_bound": 1, "sigma_x": 1,
                                                 "sigma_y": 1},
              "timings": {"round_s": 1, "fit_s": 1, "baselines_s": 1, "total_s": 3},
              "fit_method": "auto", "metrics": {"spearman_private": 0.1,
                                                 "spearman_nonprivate": 0.2,
                                                 "spearman_public_only": 0.1},
              "top_features": [{"feature": "a", "mean": 0.1, "ci90": [-1, 1]}],
              "model": "noise-aware", "noise": "xty sd 3", "information": info}
    text = format_report(result)
    assert "WARNING" in text and "account for the privacy noise" in text
    result["model"] = "plug-in"
    assert "do NOT account for the" in format_report(result)
