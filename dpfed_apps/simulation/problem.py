"""The data of a simulation: rows with an id, named features and a target, and their split
into held-out test lines, public lines and the sites' private lines."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

ID_COLUMN = "COSMIC_ID"


@dataclass(frozen=True)
class Problem:
    """A regression data set: one row per individual (cell line)."""

    ids: np.ndarray                 # row identifiers (COSMIC ids for GDSC)
    x: np.ndarray                   # (n x d) raw features
    y: np.ndarray                   # (n,) raw target (ln IC50 for GDSC)
    feature_names: tuple[str, ...]
    target: str                     # column name of the target, e.g. "Drug_1047_IC50"
    label: str                      # human-readable description
    id_column: str = ID_COLUMN
    # Rows with a gap (csv_problem(keep_incomplete=True)): their cells as read, in the order
    # id, features..., target (one cell short for a line of the wrong length, so that it stays
    # malformed). Not in x and y: the simulation gives them to the sites, whose row-wise rules
    # leave them out (split_incomplete, write_rows_csv).
    incomplete: tuple[tuple[str, ...], ...] = ()

    @property
    def n(self) -> int:
        return int(self.y.shape[0])

    @property
    def dim(self) -> int:
        return len(self.feature_names)


def gdsc_problem(drug_id: int, feature_names: Sequence[str] | None = None) -> Problem:
    """Lines with a measured response to ``drug_id``; default features by the public rule."""
    from dpfed import datasets

    names = tuple(feature_names) if feature_names else datasets.default_feature_names()
    ids, x, y = datasets.drug_dataset(drug_id, names)
    return Problem(ids, x, y, names, datasets.target_column(drug_id),
                   f"GDSC v17 {datasets.drug_label(drug_id)}, ln IC50")


def csv_problem(path: str | Path, *, id_column: str | None = None, target: str | None = None,
                feature_names: Sequence[str] | None = None,
                keep_incomplete: bool = False) -> Problem:
    """A CSV with a header: an id column (default: the first), a target (default: the last
    column) and features (default: every other column). Rows with an empty or non-numeric
    target are dropped (like the sites do); a missing feature value is an error.

    ``keep_incomplete`` (``dpfed simulate --data``): a row with a gap (a target or feature
    that is not a finite number, a missing id, the wrong number of fields) is kept aside in
    ``Problem.incomplete`` instead, for the sites to leave out; a feature or target column
    without a single finite number is an error (every row would be left out)."""
    path = Path(path)
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        rows = [row for row in reader if row]
    id_column = id_column or header[0]
    target = target or header[-1]
    for name in (id_column, target):
        if name not in header:
            raise ValueError(f"{path}: no column {name!r} (columns: {', '.join(header)})")
    names = tuple(feature_names) if feature_names else tuple(
        h for h in header if h not in (id_column, target))
    missing = [f for f in names if f not in header]
    if missing:
        raise ValueError(f"{path}: no feature column(s) {', '.join(missing)}")
    col = {h: j for j, h in enumerate(header)}
    if keep_incomplete:
        return _problem_with_gaps(path, header, rows, id_column, target, names)
    ids, xs, ys = [], [], []
    for line, row in enumerate(rows, start=2):
        try:
            yv = float(row[col[target]])
        except ValueError:
            continue
        if not math.isfinite(yv):
            continue
        try:
            xs.append([float(row[col[f]]) for f in names])
        except ValueError:
            raise ValueError(f"{path}, line {line}: a feature value is not a number") from None
        ids.append(row[col[id_column]])
        ys.append(yv)
    return Problem(np.array(ids), np.array(xs, dtype=np.float64).reshape(len(ys), len(names)),
                   np.array(ys, dtype=np.float64), names, target, f"{path.name}, target {target}",
                   id_column)


def _finite(cell: str) -> float | None:
    try:
        v = float(cell)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _problem_with_gaps(path: Path, header: list[str], rows: list[list[str]], id_column: str,
                       target: str, names: tuple[str, ...]) -> Problem:
    """csv_problem(keep_incomplete=True): complete rows in x and y, the others aside."""
    from site_node.data import MISSING_MARKERS   # the sites' own rule for a missing id

    col = {h: j for j, h in enumerate(header)}
    order = [col[id_column], *(col[f] for f in names), col[target]]
    ids, xs, ys, incomplete = [], [], [], []
    numbers = {name: 0 for name in (*names, target)}
    for row in rows:
        if len(row) != len(header):
            incomplete.append(tuple(row[j] for j in order if j < len(row))[:len(order) - 1])
            continue
        values = [_finite(row[col[f]]) for f in (*names, target)]
        for name, v in zip((*names, target), values):
            numbers[name] += v is not None
        if any(v is None for v in values) or \
                row[col[id_column]].strip().lower() in MISSING_MARKERS:
            incomplete.append(tuple(row[j] for j in order))
            continue
        ids.append(row[col[id_column]])
        xs.append(values[:-1])
        ys.append(values[-1])
    empty = [name for name, k in numbers.items() if k == 0]
    if empty:
        raise ValueError(f"{path}: no finite number in column(s) {', '.join(empty)}: every row "
                         f"would be left out (choose the features with --features)")
    return Problem(np.array(ids), np.array(xs, dtype=np.float64).reshape(len(ys), len(names)),
                   np.array(ys, dtype=np.float64), names, target, f"{path.name}, target {target}",
                   id_column, tuple(incomplete))


@dataclass(frozen=True)
class Split:
    """Row indices of the held-out test lines, the public lines and each site's lines."""

    test: np.ndarray
    public: np.ndarray
    sites: tuple[np.ndarray, ...]

    @property
    def site_sizes(self) -> tuple[int, ...]:
        return tuple(int(s.size) for s in self.sites)

    @property
    def training(self) -> np.ndarray:
        """Every row a model may learn from: the sites' and the public lines."""
        return np.concatenate([*self.sites, self.public])


def split_rows(n_rows: int, *, n_sites: int, n_public: int, n_test: int, seed: int) -> Split:
    """Disjoint random test / public / site sets; the sites share the rest (sizes within 1).

    One permutation from ``seed`` decides everything, so a seed reproduces a split exactly.
    """
    if n_sites < 1:
        raise ValueError("need at least one site")
    if n_public < 0 or n_test < 1:
        raise ValueError("need n_public >= 0 and n_test >= 1")
    n_private = n_rows - n_public - n_test
    if n_private < n_sites:
        raise ValueError(f"{n_rows} rows cannot make {n_test} test, {n_public} public lines "
                         f"and {n_sites} non-empty sites")
    order = np.random.default_rng(seed).permutation(n_rows)
    test, public, private = np.split(order, [n_test, n_test + n_public])
    return Split(np.sort(test), np.sort(public),
                 tuple(np.sort(s) for s in np.array_split(private, n_sites)))


def split_incomplete(n_incomplete: int, n_sites: int, seed: int) -> tuple[np.ndarray, ...]:
    """Which site gets each incomplete row (indices into ``Problem.incomplete``): at random,
    shares within 1. From its own generator, so the split of the complete rows
    (``split_rows``) is the same with or without them."""
    order = np.random.default_rng([seed, 1]).permutation(n_incomplete)
    return tuple(np.sort(s) for s in np.array_split(order, n_sites))


def site_ids(n_sites: int) -> list[str]:
    return [f"site-{k + 1}" for k in range(n_sites)]
