"""Which of a site's rows a round uses: row-wise rules only.

Nothing a site answers may depend on its private data for free (method.md section 12, issue
19). So no property of the rows decides whether the site answers; each rule decides, for one
row at a time, whether *that row* is used, from the row itself and public parameters
(site_node.data: a missing target, a malformed value, an empty or repeated id; here: a
non-finite pre-processing result). There is no cap on the number of rows: a secure round's
``max_site_rows`` only sizes the fixed-point grid, and a site encodes the exact statistics of
all its usable rows (``dpfed.secagg.exact``; docs/security.md, "What a refusal reveals").

* ``finite_after_preprocessing``: a row whose public pre-processing gives a non-finite number
  (a value of 1e300 whose row norm overflows) is left out, as site_node.data leaves out rows
  with a missing target or a malformed value. Under add/remove such a rule changes nothing in
  the neighbour relation: a data set with one more left-out row gives the same used rows.
"""

from __future__ import annotations

import logging

import numpy as np

__all__ = ["finite_after_preprocessing", "log_left_out"]

log = logging.getLogger(__name__)


def finite_after_preprocessing(preprocessing, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Boolean mask of the rows whose public pre-processing (``dpfed.preprocess.
    Preprocessing.apply``) gives only finite numbers: centring, the squared row norm when rows
    are normalised, and the centred target. A row-wise rule (module docstring)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    z = preprocessing.centred(x)
    with np.errstate(over="ignore", invalid="ignore"):
        ok = np.isfinite(z).all(axis=1) if z.size else np.ones(x.shape[0], dtype=bool)
        if preprocessing.normalize_rows:
            ok &= np.isfinite(np.einsum("ij,ij->i", z, z))
        ok &= np.isfinite(y - preprocessing.y_mean)
    return ok


def log_left_out(round_id: str, target: str, data, non_finite: int = 0) -> None:
    """The site's own log line of the rows a round leaves out: counts only (never sent).
    ``data`` is the round's site_node.data.RoundData; ``non_finite`` the rows that
    ``finite_after_preprocessing`` left out."""
    if data.dropped_missing_target or data.left_out or non_finite:
        log.info("round %s: left out %d row(s) with a missing %s, %d malformed row(s) (a value "
                 "that is not a finite number, a missing feature, a line that does not parse, "
                 "an empty or repeated id) and %d whose pre-processing is not finite", round_id,
                 data.dropped_missing_target, target, data.left_out, non_finite)
