"""round.toml -> an (unsigned) RoundSpec (docs/interfaces.md).

Everything data-dependent in the spec comes from the *public* rows only: the pre-processing
means, the exact public statistics added at the aggregator, and (when bounds are not given)
the bounds and budget split, tuned on auxiliary data shaped like the public rows
(``dpfed.bounds.choose_bounds_table``; method.md 4). Public rows go through the same
pre-processing as private ones and are clipped with the round's bounds (box, then the
row-norm ball when rows are normalised), like the private rows: they are added without
noise, and the fit (posterior.noise_aware) gives them their own exact likelihood, so both
parts describe the same clipped-data regression.
"""

from __future__ import annotations

import csv
import gzip
import secrets
import time
from pathlib import Path

import numpy as np

from dpfed.preprocess import Preprocessing, public_sigmas
from dpfed.sensitivity import (DEFAULT_BUDGET_SPLIT, check_neighbouring, check_xtx_rule,
                               default_budget_split, row_norm_bound)
from dpfed.statistics import clipped_exact_statistics
from dpfed.v1 import dpfed_pb2 as pb

DEFAULT_SPLIT = DEFAULT_BUDGET_SPLIT  # replace-one; add/remove: dpfed.sensitivity.DEFAULT_SPLIT_ADD_REMOVE


class RoundSpecError(ValueError):
    """round.toml is incomplete or inconsistent."""


# Every key round.toml may have, per table; anything else is an error naming the nearest
# valid key (dpfed.configkeys). neighbouring and xtx_sensitivity: the neighbouring-relation
# keys of the release work, allowed here so both changes merge.
ROUND_KEYS = frozenset({"round_id", "target", "features", "epsilon", "x_bound", "y_bound",
                        "budget_split", "quorum", "deadline_s", "sites", "public", "fit",
                        "normalize_rows", "expected_site_n", "neighbouring", "xtx_sensitivity",
                        "consent_s", "aggregation", "noise_threshold", "max_site_rows",
                        "colluders", "targets", "mechanism", "delta"})
# Secure aggregation: rows per site assumed when round.toml gives no max_site_rows.
DEFAULT_MAX_SITE_ROWS = 100_000
PUBLIC_KEYS = frozenset({"path", "normalize_rows", "scale_columns", "source"})
FIT_KEYS = frozenset({"method", "draws", "seed"})


def check_round_keys(config: dict) -> None:
    """RoundSpecError naming every unknown key of a parsed round.toml, at every level."""
    from dpfed.configkeys import unknown_key_problems
    problems = unknown_key_problems(config, ROUND_KEYS)
    for table, keys in (("public", PUBLIC_KEYS), ("fit", FIT_KEYS)):
        if table in config and not isinstance(config[table], dict):
            problems.append(f"'{table}' must be a table ([{table}])")
        elif table in config:
            problems += unknown_key_problems(config[table], keys, prefix=f"{table}.")
    if problems:
        raise RoundSpecError("round.toml: " + "; ".join(problems))


def default_quorum(config: dict) -> int:
    """quorum when round.toml does not set one: every invited site. With ``sites`` listed
    that is their number; with ``sites = []`` (every registered site) it is 0 here, and
    ``coordinator.client.Coordinator.start_round`` fills in the number of sites registered
    at the aggregator (ListSites) before signing."""
    quorum = config.get("quorum")
    if quorum is None:
        return len(config.get("sites") or [])
    if isinstance(quorum, bool) or not isinstance(quorum, int) or quorum < 1:
        raise RoundSpecError(f"round.toml: quorum must be an integer >= 1 (or omitted: every "
                             f"invited site), got {quorum!r}")
    return quorum


def read_public_rows(path: Path, target: str, features: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Feature matrix and target of a public CSV/TSV; rows without a target are dropped."""
    opener = gzip.open if path.suffix == ".gz" else open
    delimiter = "\t" if ".tsv" in path.suffixes else ","
    with opener(path, "rt", newline="") as fh:
        reader = csv.DictReader(fh, delimiter=delimiter)
        missing = [c for c in [target, *features] if c not in (reader.fieldnames or [])]
        if missing:
            raise RoundSpecError(f"{path}: missing column(s) {', '.join(missing)}")
        xs, ys = [], []
        for row in reader:
            y = row[target].strip()
            if y in ("", "NA", "NaN", "nan"):
                continue
            try:
                xs.append([float(row[f]) for f in features])
                ys.append(float(y))
            except ValueError as exc:
                raise RoundSpecError(f"{path}: non-numeric value: {exc}") from None
    if not ys:
        raise RoundSpecError(f"{path}: no public rows with a {target} value")
    return np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)


def _choose_bounds(config: dict, d: int, eps: float, x_raw: np.ndarray, y_raw: np.ndarray,
                   pre: Preprocessing, *, public: bool, features=None, draws: int = 1,
                   neighbouring: str = "add_remove", xtx_rule: str = "exact", split=None):
    """(x_bound, y_bound, budget split or None) when round.toml gives no bounds. With public
    rows: ``dpfed.bounds.choose_bounds_table`` on auxiliary data shaped like them, for
    ``expected_site_n`` rows at each of the invited sites (public numbers) whose sum holds
    ``draws`` independent noise draws (one per site; one in all for a secure round), with the
    round's mechanism; the split it picks is used unless round.toml sets one. Without public
    rows: the paper's search on Gaussian data (``choose_bounds``) scaled by
    ``dpfed.preprocess.public_sigmas``' fallbacks, split unchanged."""
    try:
        from dpfed.bounds import choose_bounds, choose_bounds_table
    except ImportError:
        raise RoundSpecError("x_bound and y_bound are required (dpfed.bounds is not "
                             "available to choose them)") from None
    n = int(config.get("expected_site_n", 500))
    if public and len(y_raw) >= 2:
        from dpfed.auxiliary import AuxiliarySource

        k = max(1, len(config.get("sites") or []))
        source = AuxiliarySource(x_raw, y_raw, pre, feature_names=features)
        table = choose_bounds_table(source, [(n * k, draws)], [eps], neighbouring=neighbouring,
                                    xtx_sensitivity=xtx_rule,
                                    x_norm_bound=row_norm_bound(pre.normalize_rows),
                                    budget_split=split)
        choice = table[(n * k, draws, float(eps))]
        bx, by = choice.bounds(*source.scales())
        return bx, by, tuple(choice.budget_split)
    chosen = choose_bounds(n, d, eps)
    if isinstance(chosen, dict):
        wx, wy = chosen["omega_x"], chosen["omega_y"]
    elif hasattr(chosen, "omega_x"):
        wx, wy = chosen.omega_x, chosen.omega_y
    else:
        wx, wy = chosen
    sigma_x, sigma_y = public_sigmas(x_raw, y_raw, pre)
    return wx * sigma_x, wy * sigma_y, None


def _aggregation(config: dict, spec: pb.RoundSpec) -> None:
    """aggregation ("independent" default, or "secure"), and for secure rounds noise_threshold
    (T, required), max_site_rows (default DEFAULT_MAX_SITE_ROWS) and colluders (c, default
    0); the aggregator and every site check them again (dpfed.secure_round)."""
    from dpfed.secure_round import AGGREGATIONS, SECURE
    mode = str(config.get("aggregation", "independent"))
    if mode not in AGGREGATIONS:
        raise RoundSpecError(f"round.toml: aggregation must be one of {', '.join(AGGREGATIONS)}, "
                             f"got {mode!r}")
    secure_keys = [k for k in ("noise_threshold", "max_site_rows", "colluders") if k in config]
    if mode != SECURE:
        if secure_keys:
            raise RoundSpecError(f"round.toml: {', '.join(secure_keys)} "
                                 f"{'needs' if len(secure_keys) == 1 else 'need'} "
                                 f"aggregation = \"secure\"")
        return
    values = {}
    for key, default in (("noise_threshold", None), ("max_site_rows", DEFAULT_MAX_SITE_ROWS),
                         ("colluders", 0)):
        v = config.get(key, default)
        if v is None:
            raise RoundSpecError("round.toml: aggregation = \"secure\" needs noise_threshold "
                                 "(T: the honest noise shares that make one full draw)")
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if key == "colluders" else 1):
            raise RoundSpecError(f"round.toml: {key} must be an integer >= "
                                 f"{0 if key == 'colluders' else 1}, got {v!r}")
        values[key] = v
    spec.aggregation = SECURE
    spec.noise_threshold = values["noise_threshold"]
    spec.max_site_rows = values["max_site_rows"]
    spec.colluders = values["colluders"]


def build_round_spec(config: dict, *, base_dir: str | Path = ".", now_ms: int | None = None,
                     ) -> pb.RoundSpec:
    """The RoundSpec described by a parsed round.toml (unsigned; coordinator_id left for the
    client to fill)."""
    base = Path(base_dir)
    check_round_keys(config)
    from coordinator import joint_spec
    problems = joint_spec.joint_keys_problems(config)
    if problems:
        raise RoundSpecError("round.toml: " + "; ".join(problems))
    joint = "targets" in config
    try:
        target = "" if joint else str(config["target"])
        features = [str(f) for f in config["features"]]
        eps = float(config["epsilon"])
    except KeyError as exc:
        raise RoundSpecError(f"round.toml needs {exc.args[0]}") from None
    if not features:
        raise RoundSpecError("round.toml: features is empty")
    d = len(features)
    neighbouring = str(config.get("neighbouring", "add_remove"))
    xtx_rule = str(config.get("xtx_sensitivity", "exact"))
    try:
        check_neighbouring(neighbouring)
        check_xtx_rule(xtx_rule)
    except ValueError as exc:
        raise RoundSpecError(f"round.toml: {exc}") from None
    split = [float(p) for p in config.get("budget_split", default_budget_split(neighbouring))]
    expected_parts = len(default_budget_split(neighbouring))
    if len(split) != expected_parts and not joint:
        raise RoundSpecError(f"round.toml: budget_split needs {expected_parts} shares under "
                             f"{neighbouring} (Sxx, Sxy, Syy{', n' if expected_parts == 4 else ''}), "
                             f"got {len(split)}")
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    spec = pb.RoundSpec(
        round_id=str(config.get("round_id") or
                     f"r-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now_ms / 1000))}-"
                     f"{secrets.token_hex(3)}"),
        target=target, feature_names=features, epsilon=eps,
        budget_split=split, neighbouring=neighbouring, xtx_sensitivity=xtx_rule,
        quorum=default_quorum(config),
        deadline_unix_ms=now_ms + int(float(config.get("deadline_s", 600)) * 1000),
        sites=[str(s) for s in config.get("sites", [])],
        created_unix_ms=now_ms)
    _aggregation(config, spec)
    if "consent_s" in config:   # else the aggregator's default (docs/protocol.md)
        consent_s = float(config["consent_s"])
        if not 0 < consent_s * 1000 < spec.deadline_unix_ms - now_ms:
            raise RoundSpecError("consent_s must be positive and shorter than deadline_s")
        spec.consent_deadline_unix_ms = now_ms + int(consent_s * 1000)
    fit = config.get("fit", {})
    spec.fit_method = str(fit.get("method", "auto"))
    spec.fit_draws = int(fit.get("draws", 5000))
    spec.fit_seed = int(fit.get("seed", 0))

    if joint:   # many targets in one release (coordinator.joint_spec)
        try:
            joint_spec.fill_joint_spec(spec, config, features, base)
        except (ValueError, OSError) as exc:
            raise RoundSpecError(f"round.toml: {exc}") from None
        return spec
    public = config.get("public", {})
    x_raw, y_raw = np.zeros((0, d)), np.zeros(0)
    xp, yp = x_raw, y_raw
    if public.get("path"):
        path = base / public["path"]
        x_raw, y_raw = read_public_rows(path, target, features)
        pre = Preprocessing.from_public_data(x_raw, y_raw,
                                             normalize_rows=bool(public.get("normalize_rows", True)),
                                             scale_columns=bool(public.get("scale_columns", True)))
        xp, yp = pre.apply(x_raw, y_raw)
        spec.public_source = str(public.get("source", f"{path.name}: {len(yp)} public rows"))
    else:
        pre = Preprocessing.identity(d) if not config.get("normalize_rows", False) else \
            Preprocessing((0.0,) * d, 0.0, True)
        spec.public_source = "none"
    spec.preprocessing.CopyFrom(pb.Preprocessing(x_mean=list(pre.x_mean), y_mean=pre.y_mean,
                                                 normalize_rows=pre.normalize_rows,
                                                 x_scale=list(pre.x_scale)))
    if "x_bound" in config and "y_bound" in config:
        spec.x_bound, spec.y_bound = float(config["x_bound"]), float(config["y_bound"])
    else:
        from dpfed.secure_round import SECURE
        draws = 1 if spec.aggregation == SECURE else max(1, len(spec.sites))
        spec.x_bound, spec.y_bound, chosen_split = _choose_bounds(
            config, d, eps, x_raw, y_raw, pre, public=bool(public.get("path")),
            features=features, draws=draws, neighbouring=neighbouring, xtx_rule=xtx_rule,
            split=split)
        if chosen_split is not None and "budget_split" not in config:
            del spec.budget_split[:]
            spec.budget_split.extend(chosen_split)
    if public.get("path"):
        # Clipped like the private rows (module docstring); exact, added without noise.
        spec.public_statistics = clipped_exact_statistics(
            xp, yp, spec.x_bound, spec.y_bound, row_norm_bound(pre.normalize_rows)).to_bytes()
    return spec
