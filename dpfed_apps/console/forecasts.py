"""The forecast of a round (``dpfed plan``, dpfed_apps.forecast), made before it starts and
kept beside the console so that a result can be shown next to what was expected of it.

The aggregator does not hold forecasts (they are the coordinator's planning, from public
inputs only), so the console keeps each in ``STATE_DIR/forecasts/ROUND_ID.json``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import numpy as np

from dpfed import jsonsafe
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.limits import ID_PATTERN, MAX_ID_CHARS

log = logging.getLogger(__name__)


class ForecastStore:
    def __init__(self, state_dir: Path):
        self.folder = Path(state_dir) / "forecasts"

    def _path(self, round_id: str) -> Path | None:
        if len(round_id) > MAX_ID_CHARS or not ID_PATTERN.fullmatch(round_id):
            return None     # never a path built from an arbitrary string
        return self.folder / f"{round_id}.json"

    def save(self, round_id: str, forecast: dict, *, note: str = "") -> None:
        path = self._path(round_id)
        if path is None:
            raise ValueError(f"not a round id: {round_id!r}")
        self.folder.mkdir(parents=True, exist_ok=True)
        record = {"round_id": round_id, "made_unix_ms": int(time.time() * 1000),
                  "note": note, "forecast": forecast}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(jsonsafe.dumps(record))
        os.replace(tmp, path)

    def load(self, round_id: str) -> dict | None:
        path = self._path(round_id)
        if path is None or not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            log.warning("forecast of round %s unreadable (%s); shown without it", round_id, exc)
            return None


def joint_public_rows(spec: pb.RoundSpec, config: dict, base_dir: Path):
    """(x, y, response rate) for the forecast of a joint round (``spec.targets``): the public
    rows that have the FIRST target's response (the forecast's representative target), raw
    features, the responses standardised by its TargetSpec (as the sites standardise them),
    and the public fill rate over every target (the rows' MCAR response rate; 1 for one
    target). None when round.toml names no public rows."""
    from coordinator.joint_spec import read_public_table

    public = config.get("public") or {}
    if not public.get("path"):
        return None
    names = [t.name for t in spec.targets]
    x, y = read_public_table(Path(base_dir) / public["path"], names, list(spec.feature_names))
    first = spec.targets[0]
    have = np.isfinite(y[:, 0])
    fill = float(np.isfinite(y).mean()) if len(names) > 1 else 1.0
    return x[have], (y[have, 0] - first.y_mean) / first.y_scale, fill


def forecast_for_spec(spec: pb.RoundSpec, x_public: np.ndarray, y_public: np.ndarray,
                      n_per_site: list[int], *, seed: int = 0,
                      response_rate: float = 1.0) -> dict:
    """``dpfed_apps.forecast.forecast_round`` for the round ``spec`` describes: its bounds,
    budget split, neighbouring relation and pre-processing, the public rows (raw, as in
    round.toml's public.path) and the planned rows of each invited site. A secure round is
    forecast as one noise draw on the sum of the sites' rows (its aggregation). A joint round
    (``spec.targets``; ``joint_public_rows`` gives its inputs) is forecast for its first
    target in a release of every target, with the spec's mechanism and delta (the gain is per
    target; each patient pays the round's (eps, delta) once)."""
    from dpfed.preprocess import Preprocessing
    from dpfed_apps.forecast import forecast_round

    pre = Preprocessing(tuple(spec.preprocessing.x_mean), spec.preprocessing.y_mean,
                        spec.preprocessing.normalize_rows,
                        x_scale=tuple(spec.preprocessing.x_scale))
    joint = {}
    if len(spec.targets):
        joint = {"mechanism": spec.mechanism or "laplace", "delta": spec.delta,
                 "targets": len(spec.targets), "response_rate": response_rate}
    out = forecast_round(x_public=x_public, y_public=y_public,
                         feature_names=list(spec.feature_names), preprocessing=pre,
                         n_per_site=n_per_site if len(n_per_site) > 1 else n_per_site[0],
                         epsilons=[spec.epsilon], bounds=(spec.x_bound, spec.y_bound),
                         neighbouring=spec.neighbouring or "add_remove",
                         xtx_sensitivity=spec.xtx_sensitivity or "exact",
                         budget_split=tuple(spec.budget_split), seed=seed,
                         aggregation=spec.aggregation or "independent", **joint)
    if joint:
        out["target"] = spec.targets[0].name
    return out
