"""The aggregation arithmetic of a round, as pure functions (method.md section 3).

The sum of the sites' releases plus the exact public statistics is computed entry by entry
exactly and rounded once (aggregator.exact_sum): the result is the correctly rounded sum,
bit-identical to ``math.fsum`` and independent of the order in which contributions arrived,
so a restart or a re-fit gives bit-identical input to the model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dpfed.fit_methods import FIT_METHODS   # a spec's fit_method, without loading the fit
from dpfed.intervals import credible_interval
from dpfed.jsonsafe import jsonable
from dpfed.noise import EXACT
from dpfed.statistics import (Statistics, StatisticsError, decode_header, encoded_values,
                              realisable)
from dpfed.v1 import dpfed_pb2 as pb

from aggregator.running_total import RunningTotal  # noqa: F401 - the sum's home; re-exported


def running_total(spec: pb.RoundSpec):
    """An empty exact running sum for ``spec``'s releases: a RunningTotal of its dimension,
    or for a joint round an aggregator.joint_round.JointRunningTotal (same interface; its
    total is a JointStatistics)."""
    if spec.targets:
        from aggregator.joint_round import JointRunningTotal
        return JointRunningTotal(len(spec.feature_names), len(spec.targets))
    return RunningTotal(len(spec.feature_names))


def exact_sum(parts: Sequence[Statistics]) -> Statistics:
    """Correctly rounded sum of statistics of one dimension (n summed as integers); the
    noise descriptions are summed too (unknown if any part's is unknown)."""
    if not parts:
        raise StatisticsError("nothing to sum")
    d = parts[0].dim
    if any(p.dim != d for p in parts):
        raise StatisticsError("cannot sum statistics of different dimensions")
    running = RunningTotal(d)
    running.add_rows(np.stack([p.upper_values() for p in parts]), sum(p.n for p in parts))
    noises = [p.noise for p in parts]
    noise = None if any(x is None for x in noises) else sum(noises[1:], noises[0])
    return running.total().with_noise(noise)


def encoded_n(data: bytes, dim: int) -> int:
    """Check that ``data`` is a valid Statistics encoding of dimension ``dim`` and return its
    n, without building the matrices: the same checks as Statistics.from_bytes (magic,
    version, length, finite values; symmetry holds by construction of the encoding) at a
    fraction of the cost on the contribution hot path."""
    d, n = decode_header(data)
    if d != dim:
        raise StatisticsError(f"statistics have dimension {d}, the round has {dim}")
    if not np.isfinite(encoded_values(data)).all():
        raise StatisticsError("statistics contain NaN or infinite values")
    return n


def exact_sum_encoded(encoded: Sequence[bytes], noise=None) -> Statistics:
    """``exact_sum`` straight from encodings (checked by ``encoded_n``), without decoding
    every release into full matrices. The encodings carry no noise description: the caller
    passes the sum's (``noise``, None = unknown)."""
    if not encoded:
        raise StatisticsError("nothing to sum")
    heads = [decode_header(e) for e in encoded]
    d = heads[0][0]
    if any(h[0] != d for h in heads):
        raise StatisticsError("cannot sum statistics of different dimensions")
    running = RunningTotal(d)
    running.add_rows(np.stack([encoded_values(e) for e in encoded]), sum(h[1] for h in heads))
    return running.total(noise=noise)


def aggregate_encoded(releases: Sequence[bytes], public: bytes | None, *, noise=None
                      ) -> Statistics:
    """Sites' encoded releases plus the encoded public statistics (if any), summed exactly;
    ``noise`` is the description of the sum (the releases' descriptions added; the public
    statistics are exact), None = unknown."""
    return exact_sum_encoded(list(releases) + ([public] if public else []), noise=noise)


def aggregate(releases: Sequence[Statistics], public: Statistics | None) -> Statistics:
    """Sites' releases plus the public statistics, added without noise (method.md 3)."""
    return exact_sum(list(releases) + ([public] if public is not None else []))


def public_statistics(spec: pb.RoundSpec) -> Statistics | None:
    """The spec's public statistics: exact by definition (computed by the coordinator from
    public rows, added without noise)."""
    return (Statistics.from_bytes(spec.public_statistics, EXACT) if spec.public_statistics
            else None)


def validate_spec(spec: pb.RoundSpec, registered_sites: Sequence[str]) -> list[str]:
    """Everything wrong with a round spec, as sentences; empty when it can be started."""
    problems = []
    d = len(spec.feature_names)
    if not spec.round_id:
        problems.append("round_id is empty")
    joint = len(spec.targets) > 0     # a joint round (aggregator.joint_round)
    if not spec.target and not joint:
        problems.append("target is empty")
    if d == 0:
        problems.append("no feature_names")
    if len(set(spec.feature_names)) != d:
        problems.append("feature_names are not unique")
    if not (math.isfinite(spec.epsilon) and spec.epsilon > 0):
        problems.append(f"epsilon must be > 0, got {spec.epsilon}")
    for name in ("x_bound", "y_bound"):
        v = getattr(spec, name)
        if not (math.isfinite(v) and v > 0):
            problems.append(f"{name} must be > 0, got {v}")
    # The mechanism: "" means the default (add/remove neighbours, exact Sxx sensitivity).
    from dpfed.sensitivity import NEIGHBOURING, XTX_SENSITIVITIES
    neighbouring = spec.neighbouring or "add_remove"
    if neighbouring not in NEIGHBOURING:
        problems.append(f"neighbouring must be one of {', '.join(NEIGHBOURING)}, got "
                        f"{spec.neighbouring!r}")
    if (spec.xtx_sensitivity or "exact") not in XTX_SENSITIVITIES:
        problems.append(f"xtx_sensitivity must be one of {', '.join(XTX_SENSITIVITIES)}, got "
                        f"{spec.xtx_sensitivity!r}")
    split = list(spec.budget_split)
    parts = {"add_remove": 4, "replace_one": 3}.get(neighbouring)
    if parts is not None and (len(split) != parts
                              or not all(math.isfinite(p) and p > 0 for p in split)
                              or abs(sum(split) - 1.0) > 1e-9):
        what = "(Sxx, Sxy, Syy, n)" if parts == 4 else "(Sxx, Sxy, Syy)"
        problems.append(f"budget_split must be {parts} positive shares {what} summing to 1 "
                        f"under {neighbouring}, got {split}")
    if spec.HasField("preprocessing") and len(spec.preprocessing.x_mean) not in (0, d):
        problems.append(f"preprocessing has {len(spec.preprocessing.x_mean)} feature means "
                        f"for {d} features")
    if spec.HasField("preprocessing") and len(spec.preprocessing.x_scale) not in (0, d):
        problems.append(f"preprocessing has {len(spec.preprocessing.x_scale)} column scales "
                        f"for {d} features")
    unknown = sorted(set(spec.sites) - set(registered_sites))
    if unknown:
        problems.append(f"invited sites are not registered: {', '.join(unknown)}")
    if len(set(spec.sites)) != len(spec.sites):
        problems.append("invited sites are listed twice")
    invited = len(spec.sites) if spec.sites else len(registered_sites)
    if spec.quorum < 1:
        problems.append("quorum must be >= 1")
    elif spec.quorum > invited:
        problems.append(f"quorum {spec.quorum} exceeds the {invited} invited sites")
    if spec.deadline_unix_ms <= 0:
        problems.append("deadline_unix_ms is not set")
    if spec.fit_method and spec.fit_method not in FIT_METHODS:
        problems.append(f"fit_method must be one of {', '.join(FIT_METHODS)}")
    # Aggregation mode and the secure-aggregation parameters (dpfed.secure_round).
    from dpfed.secure_round import secure_problems
    problems += secure_problems(spec, invited)
    # The noise mechanism, and a joint round's targets and per-target public statistics.
    from aggregator import joint_round
    problems += joint_round.mechanism_problems(spec)
    if joint:
        problems += joint_round.joint_spec_problems(spec)
    elif spec.public_statistics:
        try:
            pub = Statistics.from_bytes(spec.public_statistics)
            if pub.dim != d:
                problems.append(f"public_statistics have dimension {pub.dim}, spec has {d} features")
            elif not realisable(pub):
                problems.append("public_statistics are not the exact statistics of any rows "
                                "(their augmented Gram matrix is not positive semidefinite)")
        except StatisticsError as exc:
            problems.append(f"public_statistics do not decode: {exc}")
    return problems


def fit(stats: Statistics, method: str, draws: int, seed: int | None,
        public: Statistics | None = None, x_bound: float | None = None,
        y_bound: float | None = None):
    """(beta_mean, beta_draws (draws x d), diagnostics) of the posterior given ``stats``.

    ``method`` is a round spec's fit_method (FIT_METHODS; empty means "auto"). With
    ``public`` (the exact public statistics included in ``stats``) the diagnostics carry the
    comparison with the public-only posterior (``posterior.quality``) under
    ``"information"``. ``x_bound``, ``y_bound``: the round's public clipping bounds (the
    design prior's, and the response unit of the priors: ``fit_posterior`` y_unit)."""
    from posterior import fit_method_options, fit_posterior

    draws = int(draws or 5000)
    # The priors are stated in units of the round's public y bound (fit_posterior y_unit).
    post = fit_posterior(stats, **fit_method_options(method), draws=draws, seed=seed,
                         public=public, x_bound=x_bound, y_unit=y_bound)
    diagnostics = dict(post.diagnostics)
    diagnostics["model"] = post.model
    diagnostics["information"] = information(post.beta_draws, public, stats.dim, seed,
                                             y_unit=y_bound)
    return (np.asarray(post.beta_mean, dtype=np.float64),
            np.asarray(post.beta_draws, dtype=np.float64), diagnostics)


def information(beta_draws: np.ndarray, public: Statistics | None, dim: int,
                seed: int | None, y_unit: float | None = None,
                min_reference_draws: int = 1000) -> dict:
    """``posterior.quality.information_statement`` of a round's draws against the
    posterior of the public rows alone (exact model; at least ``min_reference_draws``
    draws), or against the prior without them."""
    from posterior import PosteriorError, fit_posterior
    from posterior.quality import information_statement

    m = None
    if public is not None and public.n >= 2:
        m = public.xtx / public.n
    if public is not None and public.n >= 1:
        reference = f"the {public.n} public rows alone"
        try:
            base = fit_posterior(public, draws=max(len(beta_draws), min_reference_draws),
                                 seed=seed,
                                 y_unit=y_unit).beta_draws
        except (PosteriorError, ValueError) as exc:
            # The comparison is a courtesy; a public-only fit that fails must not fail the
            # round. Say so instead of guessing.
            return {"verdict": "unknown", "reference": reference,
                    "text": f"Could not compare with {reference}: {exc}"}
    else:
        rng = np.random.default_rng(seed)
        lam0 = rng.gamma(2.0, 0.5, size=4000)
        base = rng.standard_normal((4000, dim)) / np.sqrt(lam0)[:, None]
        reference = "the prior alone"
    statement = information_statement(beta_draws, base, m, reference=reference)
    if public is not None and public.n >= 1:
        # The public-only posterior itself, for plots beside the round's (dpfed console).
        statement["reference_beta_mean"] = [float(v) for v in base.mean(axis=0)]
        statement["reference_beta_ci90"] = [[float(lo), float(hi)]
                                            for lo, hi in credible_interval(base, 0.9)]
    return statement


def summarize(*, spec: pb.RoundSpec, contributions: Sequence[tuple[str, int, float]],
              total: Statistics, public: Statistics | None, beta_mean: np.ndarray,
              beta_draws: np.ndarray, diagnostics: dict, round_s: float, fit_s: float) -> dict:
    """The round summary of docs/interfaces.md, plus per-coefficient posterior sd and 90%
    credible intervals from the draws (dpfed.intervals: the level used everywhere in dpfed).
    JSON-ready by dpfed.jsonsafe's rule: NaN and infinities are None (null)."""
    ci = credible_interval(beta_draws, 0.9)              # the "beta_ci90" key
    return jsonable({
        "round_id": spec.round_id,
        "dim": len(spec.feature_names),
        "n_total": int(total.n),
        "n_public": int(public.n) if public is not None else 0,
        "sites": [{"site_id": s, "n": int(n), "epsilon": float(e)} for s, n, e in contributions],
        "beta_mean": [float(b) for b in beta_mean],
        "beta_sd": [float(s) for s in beta_draws.std(axis=0)] if len(beta_draws) else [],
        "beta_ci90": [[float(lo), float(hi)] for lo, hi in ci],
        "model": diagnostics.get("model", ""),
        "noise": total.noise.summary() if total.noise is not None else "unknown",
        "information": diagnostics.get("information", {}),
        "feature_names": list(spec.feature_names),
        "target": spec.target,
        "diagnostics": diagnostics,
        **round_fields(spec, round_s, fit_s),
    })


def round_fields(spec: pb.RoundSpec, round_s: float, fit_s: float) -> dict:
    """The summary fields every round's result carries whatever it fitted (single-target
    ``summarize`` and the joint round's summary): timings, pre-processing, public source,
    bounds and fit method, all from the spec."""
    pre = spec.preprocessing
    return {
        "timings": {"round_s": round_s, "fit_s": fit_s},
        "preprocessing": {"x_mean": list(pre.x_mean), "y_mean": pre.y_mean,
                          "normalize_rows": pre.normalize_rows,
                          **({"x_scale": list(pre.x_scale)} if pre.x_scale else {})},
        "public_source": spec.public_source,
        "x_bound": spec.x_bound,
        "y_bound": spec.y_bound,
        "fit_method": spec.fit_method or "auto",
    }


