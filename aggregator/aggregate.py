"""The aggregation arithmetic of a round, as pure functions (method.md section 3).

The sum of the sites' releases plus the exact public statistics is computed entry by entry
with ``math.fsum``: the result is the correctly rounded exact sum, independent of the order in
which contributions arrived, so a restart or a re-fit gives bit-identical input to the model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# The encoding's header layout is owned by dpfed.statistics; importing it (rather than
# restating it) makes a format change fail here loudly.
from dpfed.statistics import _HEADER, _MAGIC, _VERSION, Statistics, StatisticsError
from dpfed.v1 import dpfed_pb2 as pb

FIT_METHODS = ("advi", "nuts", "fixed")


def _flat(stats: Statistics) -> np.ndarray:
    iu = np.triu_indices(stats.dim)
    return np.concatenate([stats.xtx[iu], stats.xty, [stats.yty]])


def exact_sum(parts: Sequence[Statistics]) -> Statistics:
    """Correctly rounded sum of statistics of one dimension (n summed as integers)."""
    if not parts:
        raise StatisticsError("nothing to sum")
    d = parts[0].dim
    if any(p.dim != d for p in parts):
        raise StatisticsError("cannot sum statistics of different dimensions")
    rows = np.stack([_flat(p) for p in parts])          # parts x (d(d+1)/2 + d + 1)
    body = np.array([math.fsum(col) for col in rows.T.tolist()])
    m = d * (d + 1) // 2
    xtx = np.zeros((d, d))
    xtx[np.triu_indices(d)] = body[:m]
    xtx = np.triu(xtx) + np.triu(xtx, 1).T
    return Statistics(xtx, body[m:m + d], float(body[-1]), sum(p.n for p in parts))


def encoded_n(data: bytes, dim: int) -> int:
    """Check that ``data`` is a valid Statistics encoding of dimension ``dim`` and return its
    n, without building the matrices: the same checks as Statistics.from_bytes (magic,
    version, length, finite values; symmetry holds by construction of the encoding) at a
    fraction of the cost on the contribution hot path."""
    if len(data) < _HEADER.size:
        raise StatisticsError("encoded statistics are too short")
    magic, version, d, n = _HEADER.unpack_from(data)
    if magic != _MAGIC or version != _VERSION:
        raise StatisticsError("not a dpfed Statistics encoding (bad magic or version)")
    if d != dim:
        raise StatisticsError(f"statistics have dimension {d}, the round has {dim}")
    size = _HEADER.size + 8 * (d * (d + 1) // 2 + d + 1)
    if len(data) != size:
        raise StatisticsError(f"encoded statistics of dimension {d} must be {size} bytes, "
                              f"got {len(data)}")
    if not np.isfinite(np.frombuffer(data, dtype="<f8", offset=_HEADER.size)).all():
        raise StatisticsError("statistics contain NaN or infinite values")
    return int(n)


def exact_sum_encoded(encoded: Sequence[bytes]) -> Statistics:
    """``exact_sum`` straight from encodings (checked by ``encoded_n``): stacks the raw
    upper-triangle bodies instead of decoding every release into full matrices."""
    if not encoded:
        raise StatisticsError("nothing to sum")
    heads = [_HEADER.unpack_from(e) for e in encoded]
    d = heads[0][2]
    if any(h[2] != d for h in heads):
        raise StatisticsError("cannot sum statistics of different dimensions")
    rows = np.stack([np.frombuffer(e, dtype="<f8", offset=_HEADER.size) for e in encoded])
    body = np.array([math.fsum(col) for col in rows.T.tolist()])
    m = d * (d + 1) // 2
    xtx = np.zeros((d, d))
    xtx[np.triu_indices(d)] = body[:m]
    xtx = np.triu(xtx) + np.triu(xtx, 1).T
    return Statistics(xtx, body[m:m + d], float(body[-1]), sum(h[3] for h in heads))


def aggregate_encoded(releases: Sequence[bytes], public: bytes | None) -> Statistics:
    """Sites' encoded releases plus the encoded public statistics (if any), summed exactly."""
    return exact_sum_encoded(list(releases) + ([public] if public else []))


def aggregate(releases: Sequence[Statistics], public: Statistics | None) -> Statistics:
    """Sites' releases plus the public statistics, added without noise (method.md 3)."""
    return exact_sum(list(releases) + ([public] if public is not None else []))


def public_statistics(spec: pb.RoundSpec) -> Statistics | None:
    return Statistics.from_bytes(spec.public_statistics) if spec.public_statistics else None


def validate_spec(spec: pb.RoundSpec, registered_sites: Sequence[str]) -> list[str]:
    """Everything wrong with a round spec, as sentences; empty when it can be started."""
    problems = []
    d = len(spec.feature_names)
    if not spec.round_id:
        problems.append("round_id is empty")
    if not spec.target:
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
    split = list(spec.budget_split)
    if len(split) != 3 or not all(math.isfinite(p) and p > 0 for p in split) \
            or abs(sum(split) - 1.0) > 1e-9:
        problems.append(f"budget_split must be three positive shares summing to 1, got {split}")
    if spec.HasField("preprocessing") and len(spec.preprocessing.x_mean) not in (0, d):
        problems.append(f"preprocessing has {len(spec.preprocessing.x_mean)} feature means "
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
    if spec.public_statistics:
        try:
            pub = Statistics.from_bytes(spec.public_statistics)
            if pub.dim != d:
                problems.append(f"public_statistics have dimension {pub.dim}, spec has {d} features")
        except StatisticsError as exc:
            problems.append(f"public_statistics do not decode: {exc}")
    return problems


def fit(stats: Statistics, method: str, draws: int, seed: int | None):
    """(beta_mean, beta_draws (draws x d), diagnostics) of the posterior given ``stats``."""
    method = method or "advi"
    draws = int(draws or 5000)
    try:
        from aggregator.posterior import fit_posterior
    except ImportError:
        if method != "fixed":
            raise
        return _fixed_precision_fallback(stats, draws, seed)
    post = fit_posterior(stats, method=method, draws=draws, seed=seed)
    return (np.asarray(post.beta_mean, dtype=np.float64),
            np.asarray(post.beta_draws, dtype=np.float64), dict(post.diagnostics))


def _fixed_precision_fallback(stats: Statistics, draws: int, seed: int | None):
    """Closed form with lambda = lambda0 = 1 (method.md section 1) while the PyMC model is
    not installed; the noisy Sxx is projected to PSD first so the precision is invertible."""
    from aggregator.closed_form import posterior_precision
    w, v = np.linalg.eigh(stats.xtx)
    xtx_psd = (v * np.clip(w, 0, None)) @ v.T
    prec = posterior_precision(xtx_psd)
    cov = np.linalg.inv(prec)
    cov = (cov + cov.T) / 2
    mean = cov @ stats.xty
    rng = np.random.default_rng(seed)
    beta_draws = rng.multivariate_normal(mean, cov, size=draws)
    return mean, beta_draws, {"method": "fixed", "fallback": "aggregator.closed_form"}


def summarize(*, spec: pb.RoundSpec, contributions: Sequence[tuple[str, int, float]],
              total: Statistics, public: Statistics | None, beta_mean: np.ndarray,
              beta_draws: np.ndarray, diagnostics: dict, round_s: float, fit_s: float) -> dict:
    """The round summary of docs/interfaces.md, plus per-coefficient posterior sd and 95%
    credible intervals from the draws."""
    ci = np.percentile(beta_draws, [2.5, 97.5], axis=0) if len(beta_draws) else np.zeros((2, 0))
    pre = spec.preprocessing
    return {
        "round_id": spec.round_id,
        "dim": len(spec.feature_names),
        "n_total": int(total.n),
        "n_public": int(public.n) if public is not None else 0,
        "sites": [{"site_id": s, "n": int(n), "epsilon": float(e)} for s, n, e in contributions],
        "beta_mean": [float(b) for b in beta_mean],
        "beta_sd": [float(s) for s in beta_draws.std(axis=0)] if len(beta_draws) else [],
        "beta_ci95": [[float(lo), float(hi)] for lo, hi in zip(ci[0], ci[1])],
        "feature_names": list(spec.feature_names),
        "target": spec.target,
        "diagnostics": _jsonable(diagnostics),
        "timings": {"round_s": round_s, "fit_s": fit_s},
        "preprocessing": {"x_mean": list(pre.x_mean), "y_mean": pre.y_mean,
                          "normalize_rows": pre.normalize_rows},
        "public_source": spec.public_source,
        "x_bound": spec.x_bound,
        "y_bound": spec.y_bound,
        "fit_method": spec.fit_method or "advi",
    }


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, (np.floating, float)):
        f = float(obj)
        return f if math.isfinite(f) else str(f)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (int, str, bool)) or obj is None:
        return obj
    return str(obj)
