"""Models, baselines and held-out scores, computed in process after the round.

- non-private: the same model fitted on the exact statistics of every training row (all sites
  plus the public lines), same public pre-processing, no clipping, no noise;
- public only: the model fitted on the public lines alone (what a site-less coordinator has).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dpfed.intervals import CREDIBLE_LEVEL, credible_interval
from dpfed.preprocess import Preprocessing
from dpfed_apps.simulation.problem import Problem, Split
from dpfed.statistics import Statistics, exact_statistics


@dataclass(frozen=True)
class FittedModel:
    """Posterior summary of beta: mean and (optionally) draws, in feature order."""

    beta_mean: np.ndarray
    beta_draws: np.ndarray | None = None
    method: str = "fixed"

    def predict(self, z: np.ndarray) -> np.ndarray:
        """Predicted centred target for pre-processed features ``z``: the average of
        z^T beta^(k) over the draws, which equals z^T (mean of the draws) (method.md 1)."""
        return np.asarray(z, dtype=np.float64) @ self.beta_mean

    def credible_intervals(self, level: float = CREDIBLE_LEVEL) -> np.ndarray | None:
        """dpfed.intervals.credible_interval of the draws; None with fewer than two."""
        if self.beta_draws is None or self.beta_draws.shape[0] < 2:
            return None
        return credible_interval(self.beta_draws, level)


def fit_model(stats: Statistics, *, method: str, draws: int, seed: int) -> FittedModel:
    """The posterior fit a round runs (``posterior.fit_posterior``; ``method`` one of
    ``posterior.FIT_METHODS``) on ``stats``, so the baselines use exactly the model of the
    private round."""
    from posterior import fit_method_options, fit_posterior

    post = fit_posterior(stats, **fit_method_options(method), draws=int(draws or 5000),
                         seed=seed)
    beta_draws = np.asarray(post.beta_draws, dtype=np.float64)
    return FittedModel(np.asarray(post.beta_mean, dtype=np.float64),
                       beta_draws if beta_draws.size else None,
                       str(post.diagnostics.get("method", method)))


def training_statistics(problem: Problem, rows: np.ndarray, preprocessing: Preprocessing) -> Statistics:
    """Exact (no clipping, no noise) statistics of ``rows`` after the public pre-processing."""
    z, yc = preprocessing.apply(problem.x[rows], problem.y[rows])
    return exact_statistics(z, yc)


def test_spearman(model: FittedModel, problem: Problem, split: Split,
                  preprocessing: Preprocessing) -> float:
    from dpfed.metrics import spearman

    z = preprocessing.transform_x(problem.x[split.test])
    return spearman(model.predict(z), problem.y[split.test])


def baseline_models(problem: Problem, split: Split, preprocessing: Preprocessing, *,
                    method: str, draws: int, seed: int) -> dict[str, FittedModel]:
    """``{"nonprivate": ..., "public_only": ...}`` (see the module docstring)."""
    return {
        "nonprivate": fit_model(training_statistics(problem, split.training, preprocessing),
                                method=method, draws=draws, seed=seed),
        "public_only": fit_model(training_statistics(problem, split.public, preprocessing),
                                 method=method, draws=draws, seed=seed),
    }


def model_from_result(result) -> FittedModel:
    """A ``FittedModel`` from a ``pb.RoundResult`` (summary_json + beta_draws bytes)."""
    summary = json.loads(result.summary_json)
    draws = None
    if result.draws and result.dim and result.beta_draws:
        draws = np.frombuffer(result.beta_draws, dtype="<f8").astype(np.float64)
        draws = draws.reshape(int(result.draws), int(result.dim))
    if summary.get("beta_mean") is not None:
        mean = np.asarray(summary["beta_mean"], dtype=np.float64)
    elif draws is not None:
        mean = draws.mean(axis=0)
    else:
        raise ValueError("round result has neither beta_mean nor draws")
    return FittedModel(mean, draws, str(summary.get("diagnostics", {}).get("method", "")))


def feature_table(model: FittedModel, feature_names: Sequence[str], top: int = 10) -> list[dict]:
    """Features ranked by |posterior mean| with their 90 % credible intervals (if draws)."""
    ci = model.credible_intervals(0.9)           # the "ci90" key
    order = np.argsort(-np.abs(model.beta_mean), kind="stable")[:top]
    rows = []
    for j in order:
        row = {"feature": feature_names[j], "mean": float(model.beta_mean[j])}
        if ci is not None:
            row["ci90"] = [float(ci[j, 0]), float(ci[j, 1])]
        rows.append(row)
    return rows
