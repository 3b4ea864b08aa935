"""Reading the site's private data file and selecting one round's columns.

CSV and TSV are read with the csv module, Parquet with pyarrow (no pandas). Rows with a
missing target are dropped (method.md section 2, step 1); everything else that is wrong is an
error with the row and column named, because silently imputing or dropping would change the
data set the privacy guarantee is about.

Raw rows never leave this module: callers get float arrays (x, y) for the release and nothing
else. No message of this module quotes a value of the file: not a cell, not a patient id, not
a header cell (a file without a header row has data there). ``str(DataError)`` is for the
*local* log and names the file, column names from the config or the round spec, row numbers
and the kind of problem; ``DataError.public_reason`` is what may be sent to the coordinator in
a Refusal (columns and kinds only, no row numbers). Only the debug switch
``[data] log_patient_ids = true`` lets the local message quote a duplicated patient id.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from site_node.config import DataConfig

MISSING_MARKERS = frozenset({"", "na", "n/a", "nan", "null", "none"})


class DataError(ValueError):
    """The data file cannot give the requested columns. ``public_reason`` is safe to share."""

    def __init__(self, message: str, public_reason: str | None = None):
        super().__init__(message)
        self.public_reason = public_reason or "data problem at the site (details in the site log)"


@dataclass(frozen=True)
class Table:
    """The file's columns by name; text files keep raw strings, Parquet typed values.
    ``first_line`` is the 1-based file line of row 0 (for messages), 0 for Parquet."""

    path: Path
    columns: dict[str, list]
    n_rows: int
    first_line: int

    def where(self, row: int) -> str:
        if self.first_line:
            return f"row {row + 1} (line {row + self.first_line})"
        return f"row {row + 1}"


@dataclass(frozen=True)
class RoundData:
    """One round's private arrays: x is n x d in the order of ``features``, y is n."""

    x: np.ndarray
    y: np.ndarray
    dropped_missing_target: int
    # For messages about a row of x/y: its row in the file (0-based) and the file line of
    # file row 0 (0 for Parquet, see Table.where).
    rows: tuple[int, ...] = ()
    first_line: int = 0

    @property
    def n(self) -> int:
        return int(self.y.shape[0])

    def where(self, k: int) -> str:
        """Where row ``k`` of x/y is in the file ("row 7 (line 8)"), for local messages."""
        row = self.rows[k] if k < len(self.rows) else k
        if self.first_line:
            return f"row {row + 1} (line {row + self.first_line})"
        return f"row {row + 1}"


def read_table(path: str | Path, fmt: str, max_bytes: int | None = None) -> Table:
    path = Path(path)
    if not path.exists():
        raise DataError(f"data file {path} does not exist", "data file not found at the site")
    if not path.is_file():
        raise DataError(f"data file {path} is not a regular file", "data file is not a file")
    size = path.stat().st_size
    if size == 0:
        raise DataError(f"data file {path} is empty", "data file is empty")
    if max_bytes is not None and size > max_bytes:
        # Checked on the size alone, before reading: the text reader holds the whole file.
        raise DataError(f"data file {path} has {size} bytes, more than data.max_bytes = "
                        f"{max_bytes}", "data file exceeds the site's size limit")
    if fmt == "parquet":
        return _read_parquet(path)
    if fmt in ("csv", "tsv"):
        return _read_text(path, "," if fmt == "csv" else "\t")
    raise DataError(f"unknown data format {fmt!r}")


def _read_text(path: Path, delimiter: str) -> Table:
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            rows = list(csv.reader(fh, delimiter=delimiter))
    except UnicodeDecodeError as exc:  # binary garbage, wrong encoding
        # Not the exception's text: it quotes the offending byte.
        raise DataError(f"data file {path} cannot be read as UTF-8 text: invalid byte at "
                        f"offset {exc.start} of the file's text",
                        "data file is not readable UTF-8 text") from None
    except csv.Error as exc:  # NUL, over-long field, stray newline: the csv module's messages
        # name the kind of problem (e.g. "line contains NUL"), never the field's content.
        raise DataError(f"data file {path} cannot be read as delimited text: {exc}",
                        "data file is not readable UTF-8 text") from None
    # Blank lines carry no record.
    rows = [r for r in rows if any(cell.strip() for cell in r)]
    if not rows:
        raise DataError(f"data file {path} is empty", "data file is empty")
    header = [h.strip() for h in rows[0]]
    if len(set(header)) != len(header):
        # Positions, not names: in a file without a header row these "names" are the first
        # patient's values.
        dup = [j + 1 for j, h in enumerate(header) if header.count(h) > 1]
        raise DataError(f"data file {path}: the first row repeats a column name (columns "
                        f"{', '.join(map(str, dup))}); is the header row missing?",
                        "duplicate column names in the data file's first row (is the header "
                        "row missing?)")
    body = rows[1:]
    for i, r in enumerate(body):
        if len(r) != len(header):
            raise DataError(f"data file {path}: row {i + 1} has {len(r)} fields, the header has "
                            f"{len(header)}")
    columns = {name: [r[j] for r in body] for j, name in enumerate(header)}
    return Table(path, columns, len(body), first_line=2)


def _read_parquet(path: Path) -> Table:
    import pyarrow.parquet as pq  # only sites with Parquet files need pyarrow loaded

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several unrelated types for a bad file
        # Only the type: pyarrow's messages may quote the file's content.
        raise DataError(f"data file {path} cannot be read as Parquet ({type(exc).__name__})",
                        "data file is not readable Parquet") from None
    if len(set(table.column_names)) != len(table.column_names):
        dup = [j + 1 for j, h in enumerate(table.column_names)
               if table.column_names.count(h) > 1]
        raise DataError(f"data file {path}: repeated column names (columns "
                        f"{', '.join(map(str, dup))})", "duplicate column names in the data file")
    columns = {name: table.column(name).to_pylist() for name in table.column_names}
    return Table(path, columns, table.num_rows, first_line=0)


def _is_missing(value) -> bool:
    if value is None:
        return True
    if isinstance(value, str):
        return value.strip().lower() in MISSING_MARKERS
    if isinstance(value, float):
        return math.isnan(value)
    return False


def _to_float(value, table: Table, row: int, column: str) -> float:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        v = float(value)
    elif isinstance(value, str):
        try:
            v = float(value.strip())
        except ValueError:
            raise DataError(f"{table.path}: {table.where(row)}, column {column!r}: text that "
                            "is not a number in a numeric column",
                            f"non-numeric value in column {column!r}") from None
    else:
        raise DataError(f"{table.path}: {table.where(row)}, column {column!r}: value of type "
                        f"{type(value).__name__} in a numeric column",
                        f"non-numeric value in column {column!r}")
    if math.isinf(v):
        raise DataError(f"{table.path}: {table.where(row)}, column {column!r}: infinite value",
                        f"infinite value in column {column!r}")
    if math.isnan(v):  # spellings the missing markers do not cover, e.g. "-nan", "+NaN"
        raise DataError(f"{table.path}: {table.where(row)}, column {column!r}: NaN value",
                        f"NaN value in column {column!r}")
    return v


def select_round_data(table: Table, features: list[str], target: str,
                      config: DataConfig) -> RoundData:
    """x (features in the given order) and y (target) for one round, as float arrays.

    Rows with a missing target are dropped. A missing feature value is an error, not a drop:
    which rows are used must not depend on the features in a way nobody chose.
    """
    names = {name: config.column_for(name) for name in [*features, target]}
    missing = [f"{n!r}" + (f" (file column {c!r})" if c != n else "")
               for n, c in names.items() if c not in table.columns]
    if missing:
        raise DataError(f"{table.path}: missing column(s) {', '.join(missing)}",
                        f"column(s) not available at the site: {', '.join(missing)}")
    if config.id_column:
        # The id column is never a feature or the target, even with allowed_features = ["*"].
        if config.id_column in names.values():
            raise DataError(f"{table.path}: the round asks for the id column "
                            f"{config.id_column!r} as a feature or target; it is never released",
                            "the round asks for the site's id column, which is never released")
        _check_ids(table, config.id_column, config.log_patient_ids)
    if table.n_rows == 0:
        raise DataError(f"{table.path} has a header but no rows", "data file has no rows")

    target_values = table.columns[names[target]]
    keep = [i for i, v in enumerate(target_values) if not _is_missing(v)]
    y = np.array([_to_float(target_values[i], table, i, names[target]) for i in keep], dtype=np.float64)
    x = np.empty((len(keep), len(features)), dtype=np.float64)
    for j, feature in enumerate(features):
        column = names[feature]
        values = table.columns[column]
        for k, i in enumerate(keep):
            v = values[i]
            if _is_missing(v):
                raise DataError(f"{table.path}: {table.where(i)}, column {column!r}: missing "
                                "(NaN) feature value",
                                f"missing values in feature column {column!r}")
            x[k, j] = _to_float(v, table, i, column)
    return RoundData(x=x, y=y, dropped_missing_target=table.n_rows - len(keep),
                     rows=tuple(keep), first_line=table.first_line)


def _check_ids(table: Table, id_column: str, log_ids: bool = False) -> None:
    """Every row has an id and no id repeats. ``log_ids`` ([data] log_patient_ids, a debug
    switch) lets the local message quote the duplicated id; by default only rows are named."""
    if id_column not in table.columns:
        raise DataError(f"{table.path}: id column {id_column!r} is missing",
                        f"id column {id_column!r} missing")
    seen: dict = {}
    for i, v in enumerate(table.columns[id_column]):
        if _is_missing(v):
            raise DataError(f"{table.path}: {table.where(i)}: empty id in column {id_column!r}",
                            "rows without an id")
        key = v.strip() if isinstance(v, str) else v
        if key in seen:
            shown = f" {key!r}" if log_ids else ""
            raise DataError(f"{table.path}: duplicate id{shown} in column {id_column!r} at "
                            f"{table.where(seen[key])} and {table.where(i)}",
                            "duplicate patient ids in the data file")
        seen[key] = i


def load_round_data(config: DataConfig, features: list[str], target: str) -> RoundData:
    """Read the data file and select one round's columns (see select_round_data)."""
    return select_round_data(read_table(config.path, config.format, config.max_bytes),
                             list(features), target, config)


def describe(config: DataConfig) -> dict:
    """Shape of the data file without values, for ``dpfed site check``."""
    table = read_table(config.path, config.format, config.max_bytes)
    if config.id_column:
        _check_ids(table, config.id_column, config.log_patient_ids)
    return {"path": str(table.path), "format": config.format, "rows": table.n_rows,
            "columns": list(table.columns)}
