"""The FITTING phase: a closed round's sum of releases plus the public statistics, the
posterior (aggregator.aggregate.fit), and the stored result. A plain function; entering
FITTING (aggregator.rounds.transitions) decides when it runs (one fit at a time, on its own
thread)."""

from __future__ import annotations

import json
import time

import numpy as np

from dpfed.jsonsafe import jsonable
from dpfed.v1 import dpfed_pb2 as pb

from aggregator import aggregate
from aggregator.rounds.contributions import AcceptedContribution, sum_noise, with_public
from aggregator.store import StoredResult


def fit_round(spec: pb.RoundSpec, running: aggregate.RunningTotal,
              parts: list[tuple[str, AcceptedContribution]], *, round_s: float,
              skip_fit: bool = False, dropped: list[str] = (), phases: list = ()):
    """(StoredResult, the fitted Statistics, fit seconds) for ``spec`` given the running sum
    of its accepted releases ``parts`` (``running`` is changed: pass a copy). Raises whatever
    the fit raises; the caller fails the round with it."""
    if spec.targets:
        return fit_joint_round(spec, running, parts, round_s=round_s, skip_fit=skip_fit,
                               dropped=dropped, phases=phases)
    t0 = time.perf_counter()
    public = aggregate.public_statistics(spec)
    total = with_public(running, spec, sum_noise(c.noise for _, c in parts))
    d = total.dim
    if skip_fit:
        beta_mean, draws, diag = np.zeros(d), np.zeros((0, d)), {"skipped": True}
    else:
        beta_mean, draws, diag = aggregate.fit(total, spec.fit_method, spec.fit_draws,
                                               spec.fit_seed or None, public=public,
                                               x_bound=spec.x_bound or None,
                                               y_bound=spec.y_bound or None)
    fit_s = time.perf_counter() - t0
    summary = aggregate.summarize(
        spec=spec, contributions=[(s, c.n, c.epsilon) for s, c in parts], total=total,
        public=public, beta_mean=beta_mean, beta_draws=draws, diagnostics=diag,
        round_s=round_s, fit_s=fit_s)
    # Who was selected but never released, and the time of each phase (the fit's own
    # seconds for the running FITTING phase).
    summary["dropped"] = list(dropped)
    # How the releases were combined (docs/protocol.md): "secure" sums carry C shares of 1/T
    # of one noise draw (``noise``), and each site's n is 0 (never released on its own).
    summary["aggregation"] = spec.aggregation or "independent"
    summary["phases"] = [{"phase": p, "started_unix_ms": t, "seconds": s or fit_s}
                         for p, t, s in phases]
    result = StoredResult(spec.round_id, json.dumps(summary, sort_keys=True),
                          np.ascontiguousarray(draws, dtype="<f8").tobytes(),
                          int(draws.shape[0]), int(d))
    return result, total, fit_s


def fit_joint_round(spec: pb.RoundSpec, running, parts: list[tuple[str, AcceptedContribution]],
                    *, round_s: float, skip_fit: bool = False, dropped: list[str] = (),
                    phases: list = ()):
    """``fit_round`` of a joint round (aggregator.joint_fit): one posterior per target. The
    stored result: summary_json with the round's fields and "targets" (one entry per target,
    spec order: the single round's per-target fields, or "status": "failed" and why),
    beta_draws m blocks of (draws x d) in spec order (NaN for a target that did not fit),
    ``draws`` the rows of one block. Raises JointFitError if no target fitted."""
    from aggregator.joint_fit import fit_draws, fit_joint
    from aggregator.joint_round import calibration
    t0 = time.perf_counter()
    private = with_public(running, spec, sum_noise(c.noise for _, c in parts))
    entries, draws, keep = fit_joint(spec, private, skip_fit=skip_fit)
    fit_s = time.perf_counter() - t0
    cal = calibration(spec)
    fitted = sum(e.get("status") == "fitted" for e in entries)
    summary = jsonable({
        "round_id": spec.round_id,
        "joint": True,
        "dim": len(spec.feature_names),
        "m": len(spec.targets),
        "fitted": fitted,
        "n_total": int(private.n_x),
        "n_public": max((e["n_public"] for e in entries), default=0),
        "sites": [{"site_id": s, "n": int(c.n), "epsilon": float(c.epsilon)}
                  for s, c in parts],
        "mechanism": spec.mechanism or "laplace",
        "epsilon": spec.epsilon,
        "delta": spec.delta,
        # The GDP parameter of one site's release (per patient; gaussian rounds).
        "gdp_mu": cal.mu if (spec.mechanism or "laplace") == "gaussian" else None,
        "noise": private.noise.summary() if private.noise is not None else "unknown",
        "feature_names": list(spec.feature_names),
        "target": "",
        "targets": entries,
        "fit_draws_per_target": fit_draws(spec),
        "stored_draws_per_target": keep,
        **aggregate.round_fields(spec, round_s, fit_s),
        "dropped": list(dropped),
        "aggregation": spec.aggregation or "independent",
        "phases": [{"phase": p, "started_unix_ms": t, "seconds": s or fit_s}
                   for p, t, s in phases],
    })
    result = StoredResult(spec.round_id, json.dumps(summary, sort_keys=True),
                          np.ascontiguousarray(draws, dtype="<f8").tobytes(), int(keep),
                          len(spec.feature_names))
    return result, private, fit_s
