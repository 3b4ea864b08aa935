"""round.toml -> the joint part of a RoundSpec: many targets in one round (issue 23;
docs/interfaces.md "round.toml", docs/protocol.md "Joint rounds").

``targets = ["Drug_1", ...]`` (instead of ``target``) asks every site for ONE joint release:
Sxx once, and (Sxy_j, Syy_j, n_j) per target over the rows that have response j
(dpfed.joint_statistics; method.md section 13). Everything here comes from the *public* rows:

- each target's centre and scale (TargetSpec y_mean, y_scale): the mean and standard
  deviation of the public responses present; a target with fewer than 2 public values is
  refused (no public scale to standardise it by). The sites clip (y - y_mean) / y_scale to
  +-y_bound, so one y_bound and one noise law per part serve every target;
- the features' pre-processing (means, column scales, row normalisation), as today;
- spec.public_statistics: the PublicTargets of the public rows (per target, over the rows
  with that response), standardised and clipped exactly like the private rows.

Bounds, when round.toml does not give them (``x_bound``, ``y_bound`` in standardised units):
``y_bound = DEFAULT_Y_BOUND`` (0.5 public standard deviations: every target's Sxy noise grows
with y_bound, and at m targets the noise of each Sxy_j is sqrt(m) (Gaussian) or m (Laplace)
times a single round's, so a joint round clips responses harder than a single one; the
study's tuning may replace it), and ``x_bound = 1`` with normalised rows (the row-norm ball
of radius 1 bounds every coordinate, so a box of 1 never clips beyond it) — without row
normalisation round.toml must give x_bound. The mechanism: ``mechanism = "laplace"`` (pure
epsilon, default) or ``"gaussian"`` with ``delta``; neighbouring add/remove only;
budget_split 4 shares (default dpfed.joint_noise.JOINT_DEFAULT_SPLIT).
"""

from __future__ import annotations

import csv
import gzip
import math
from pathlib import Path

import numpy as np

from dpfed.preprocess import Preprocessing
from dpfed.sensitivity import row_norm_bound
from dpfed.v1 import dpfed_pb2 as pb

DEFAULT_Y_BOUND = 0.5
DEFAULT_X_BOUND_NORMALISED = 1.0
MIN_PUBLIC_VALUES = 2
_MISSING = ("", "NA", "NaN", "nan", "NULL", "null")


def joint_keys_problems(config: dict) -> list[str]:
    """round.toml keys that contradict a joint round (or the mechanism keys misused)."""
    problems = []
    joint = "targets" in config
    if joint and "target" in config:
        problems.append("give either target (one response) or targets (a joint round), "
                        "not both")
    mech = config.get("mechanism", "laplace")
    if mech not in ("laplace", "gaussian"):
        problems.append(f"mechanism must be \"laplace\" or \"gaussian\", got {mech!r}")
    elif not joint and mech != "laplace":
        problems.append("mechanism = \"gaussian\" needs a joint round (targets = [...])")
    if "delta" in config and mech != "gaussian":
        problems.append("delta is only for mechanism = \"gaussian\"")
    if mech == "gaussian" and joint:
        delta = config.get("delta")
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) \
                or not (math.isfinite(delta) and 0 < delta < 1):
            problems.append(f"mechanism = \"gaussian\" needs delta with 0 < delta < 1, "
                            f"got {delta!r}")
    if joint:
        if config.get("neighbouring", "add_remove") != "add_remove":
            problems.append("a joint round releases every count with noise: neighbouring "
                            "must be add_remove")
        if config.get("xtx_sensitivity", "exact") != "exact":
            problems.append("a joint round uses the exact Sxx sensitivity: remove "
                            "xtx_sensitivity")
    return problems


def target_list(config: dict) -> list[str]:
    """round.toml ``targets``: a non-empty list of distinct response column names."""
    targets = config["targets"]
    if not isinstance(targets, list) or not targets \
            or not all(isinstance(t, str) and t for t in targets):
        raise ValueError("targets must be a non-empty list of response column names")
    if len(set(targets)) != len(targets):
        dup = sorted({t for t in targets if targets.count(t) > 1})
        raise ValueError(f"targets are listed twice: {', '.join(dup[:5])}")
    return list(targets)


def read_public_table(path: Path, targets: list[str], features: list[str]
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(x (n, d), y (n, m) with NaN for a missing response) of a public CSV/TSV: rows with a
    missing or non-numeric feature are dropped (as the sites drop theirs); a response that is
    empty/NA is missing, one that is not a number is an error naming the column."""
    opener = gzip.open if path.suffix == ".gz" else open
    delimiter = "\t" if ".tsv" in path.suffixes else ","
    with opener(path, "rt", newline="") as fh:
        reader = csv.DictReader(fh, delimiter=delimiter)
        missing = [c for c in [*targets, *features] if c not in (reader.fieldnames or [])]
        if missing:
            shown = ", ".join(missing[:10]) + (f" (and {len(missing) - 10} more)"
                                                if len(missing) > 10 else "")
            raise ValueError(f"{path}: missing column(s) {shown}")
        xs, ys = [], []
        for row in reader:
            try:
                xr = [float(row[f]) for f in features]
            except (TypeError, ValueError):
                continue
            if not all(math.isfinite(v) for v in xr):
                continue
            yr = []
            for t in targets:
                v = (row[t] or "").strip()
                if v in _MISSING:
                    yr.append(math.nan)
                    continue
                try:
                    yr.append(float(v))
                except ValueError:
                    raise ValueError(f"{path}: column {t} has a non-numeric value") from None
            xs.append(xr)
            ys.append(yr)
    if not xs:
        raise ValueError(f"{path}: no public rows with every feature present")
    y = np.asarray(ys, dtype=np.float64)
    y[~np.isfinite(y)] = np.nan
    return np.asarray(xs, dtype=np.float64), y


def centre_scale(y: np.ndarray, targets: list[str]) -> list[tuple[float, float]]:
    """(mean, sd) of each target's public values present; ValueError naming every target
    with fewer than MIN_PUBLIC_VALUES values or no spread."""
    out, few, flat = [], [], []
    for j, name in enumerate(targets):
        v = y[:, j][~np.isnan(y[:, j])]
        if len(v) < MIN_PUBLIC_VALUES:
            few.append(name)
            continue
        sd = float(np.std(v, ddof=1))
        if not (math.isfinite(sd) and sd > 0):
            flat.append(name)
            continue
        out.append((float(np.mean(v)), sd))
    problems = []
    if few:
        problems.append(f"{len(few)} target(s) have fewer than {MIN_PUBLIC_VALUES} public "
                        f"values (no public centre and scale): {', '.join(few[:10])}")
    if flat:
        problems.append(f"{len(flat)} target(s) have no spread in the public rows: "
                        f"{', '.join(flat[:10])}")
    if problems:
        raise ValueError("; ".join(problems))
    return out


def fill_joint_spec(spec: pb.RoundSpec, config: dict, features: list[str], base: Path
                    ) -> None:
    """Complete ``spec`` (ids, epsilon, deadlines, fit already set by build_round_spec) as
    a joint round from round.toml ``config``. ValueError on anything inconsistent."""
    from dpfed.joint_noise import JOINT_DEFAULT_SPLIT
    from dpfed.joint_statistics import public_targets
    targets = target_list(config)
    d = len(features)
    spec.target = ""
    spec.mechanism = str(config.get("mechanism", "laplace"))
    spec.delta = float(config["delta"]) if spec.mechanism == "gaussian" else 0.0
    spec.neighbouring = "add_remove"
    spec.xtx_sensitivity = "exact"
    split = [float(p) for p in config.get("budget_split", JOINT_DEFAULT_SPLIT)]
    if len(split) != 4:
        raise ValueError(f"a joint round's budget_split needs 4 shares (Sxx, Sxy, Syy, n), "
                         f"got {len(split)}")
    del spec.budget_split[:]
    spec.budget_split.extend(split)
    public = config.get("public", {})
    if not public.get("path"):
        raise ValueError("a joint round needs public rows ([public] path): each target's "
                         "centre and scale come from them")
    path = base / public["path"]
    x_raw, y_raw = read_public_table(path, targets, features)
    scales = centre_scale(y_raw, targets)
    normalize = bool(public.get("normalize_rows", True))
    pre = Preprocessing.from_public_data(x_raw, np.zeros(len(x_raw)), normalize_rows=normalize,
                                         scale_columns=bool(public.get("scale_columns", True)))
    spec.preprocessing.CopyFrom(pb.Preprocessing(x_mean=list(pre.x_mean), y_mean=0.0,
                                                 normalize_rows=pre.normalize_rows,
                                                 x_scale=list(pre.x_scale)))
    for name, (mean, sd) in zip(targets, scales):
        spec.targets.append(pb.TargetSpec(name=name, y_mean=mean, y_scale=sd))
    if "x_bound" in config:
        spec.x_bound = float(config["x_bound"])
    elif normalize:
        spec.x_bound = DEFAULT_X_BOUND_NORMALISED
    else:
        raise ValueError("a joint round without row normalisation needs x_bound "
                         "(public.normalize_rows = false)")
    spec.y_bound = float(config.get("y_bound", DEFAULT_Y_BOUND))
    for name in ("x_bound", "y_bound"):
        v = getattr(spec, name)
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a finite number > 0")
    xp = pre.transform_x(x_raw)
    means = np.array([m for m, _ in scales])
    sds = np.array([s for _, s in scales])
    yp = (y_raw - means) / sds
    spec.public_statistics = public_targets(xp, yp, spec.x_bound, spec.y_bound,
                                            row_norm_bound(pre.normalize_rows)).to_bytes()
    spec.public_source = str(public.get(
        "source", f"{path.name}: {len(xp)} public rows, {int((~np.isnan(y_raw)).sum())} "
                  f"public responses"))
