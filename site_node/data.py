"""Reading the site's private data file and selecting one round's columns.

CSV and TSV are read with the csv module, Parquet with pyarrow (no pandas). Rows with a
missing target are dropped (method.md section 2, step 1).

Nothing about the rows may decide whether the site answers a round (method.md section 12,
issue 19: a refusal that depends on the data is a free answer about it). So every problem of
one row is handled by leaving *that row* out, a row-wise rule that costs nothing under
add/remove (a data set with one more left-out row gives the same used rows): a value that is
not a number, NaN or infinite, a missing feature, a line with the wrong number of fields or
that the csv module cannot parse, an empty id. Rows whose id repeats are all left out
(adding or removing one row then changes the used rows by at most one row). Only the counts
are kept, for the site's own log (``RoundData.left_out``) and ``dpfed site check``
(``audit_rows``: rows used, rows left out by reason and column; site_node.gaps); they are
never sent (docs/method.md, "Which rows are used"). In text files a record is one
line: a quoted field cannot swallow the lines after it. What still raises ``DataError`` is a
fault of the file as a whole, the same whatever its rows hold: no file, not a file, over the
site's size limit, no header, a repeated column name, a column the round needs that the file
does not have, the id column asked for as a feature (docs/security.md, "What a refusal
reveals").

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
import operator
from collections.abc import Mapping
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
    columns: Mapping[str, list]
    n_rows: int
    first_line: int
    # Rows that could not be parsed into the header's fields (left out of every round).
    malformed: frozenset = frozenset()
    # Names the text header repeats (``columns`` holds the first of each), and the header.
    duplicated: frozenset = frozenset()
    header: tuple = ()

    def check_unique(self, names=None) -> None:
        """DataError if the header repeats one of ``names`` (None: any name). Positions, not
        names, in the message: in a file without a header row they are patient values."""
        dup = [j + 1 for j, h in enumerate(self.header) if h in self.duplicated
               and (names is None or h in names)]
        if dup:
            raise DataError(f"data file {self.path}: the first row repeats a column name "
                            f"(columns {', '.join(map(str, dup))}); is the header row missing?",
                            "duplicate column names in the data file's first row (is the "
                            "header row missing?)")

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
    # Rows left out by the row-wise rules (module docstring), other than a missing target:
    # a count for the site's own log, never sent.
    left_out: int = 0
    # The patient id of each row of x/y (site_node.patients.normalise_id), with an id column;
    # never leaves the site (the ledger keeps only a keyed hash of it).
    ids: tuple[str, ...] = ()

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
    """The data file's Table, after the checks of ``check_file`` (DataError)."""
    path = check_file(path, fmt, max_bytes)
    return parse_table(path, fmt)


def check_file(path: str | Path, fmt: str, max_bytes: int | None = None) -> Path:
    """``path`` if it names a non-empty regular file within ``max_bytes`` in a known format;
    DataError otherwise (checked on the size alone, before a byte is read)."""
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
    if fmt not in FORMATS:
        raise DataError(f"unknown data format {fmt!r}")
    return path


# The formats ``read_table`` parses.
FORMATS = ("csv", "tsv", "parquet")


def parse_table(path: Path, fmt: str, raw: bytes | None = None) -> Table:
    """The Table of ``path`` (its bytes ``raw`` when given: the bytes a TableCache hashed)."""
    if fmt == "parquet":
        return _read_parquet(path, raw)
    return _read_text(path, "," if fmt == "csv" else "\t", raw)


def _parse_line(line: str, delimiter: str) -> list[str] | None:
    """One line's fields, or None if the csv module cannot parse it (e.g. a field over its
    size limit). A line is parsed on its own: an unbalanced quote cannot reach the next.

    A non-empty line without a quote, a carriage return or a NUL, shorter than the csv
    module's field size limit, is split on the delimiter: the csv module gives exactly those
    fields for it (tests/test_site_data.py compares the two), 1.6x faster on a 273-column
    file (docs/benchmarks.md, "Secure joint round")."""
    if (line and '"' not in line and "\r" not in line and "\0" not in line
            and len(line) <= csv.field_size_limit()):
        return line.split(delimiter)
    try:
        return next(csv.reader([line], delimiter=delimiter), [])
    except csv.Error:
        return None


def _read_text(path: Path, delimiter: str, raw: bytes | None = None) -> Table:
    # Bytes that are not UTF-8 become U+FFFD: a cell holding them is not a number, so only
    # that row is left out (a file-wide decoding error would let one row refuse the round).
    text = (path.read_bytes() if raw is None else raw).decode("utf-8-sig", errors="replace")
    lines = [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]
    # Blank lines carry no record; numbered from 1 like the file's lines.
    numbered = [(k + 1, line) for k, line in enumerate(lines) if line.strip()]
    if not numbered:
        raise DataError(f"data file {path} is empty", "data file is empty")
    header_fields = _parse_line(numbered[0][1], delimiter)
    if not header_fields or not any(h.strip() for h in header_fields):
        raise DataError(f"data file {path}: the header line cannot be read",
                        "the data file's header line cannot be read")
    header = [h.strip() for h in header_fields]
    # A repeated name is an error only for a round that needs that column (select_round_data,
    # describe): in a file without a header row these "names" are the first patient's values,
    # and whether they repeat must not decide a round's answer.
    duplicated = frozenset(h for h in header if header.count(h) > 1)
    body, malformed = [], set()
    for i, (_, line) in enumerate(numbered[1:]):
        fields = _parse_line(line, delimiter)
        if fields is None or len(fields) != len(header):
            malformed.add(i)          # a row-wise rule: this row is left out
            fields = [None] * len(header)
        # A tuple of strs: the garbage collector stops tracking it after its first pass; a
        # list it would walk again at every collection while the file is read.
        body.append(tuple(fields))
    return Table(path, TextColumns(header, body), len(body), first_line=2,
                 malformed=frozenset(malformed), duplicated=duplicated, header=tuple(header))


class TextColumns(Mapping):
    """A text file's columns by name (the first of a repeated name), each built from the
    parsed lines the first time it is asked for: a round reads the columns it names only.
    Every cell is a str (None in a malformed row). ``cells`` reads several columns row by
    row, in the order the lines were parsed: a joint round's 262 response columns of 10,000
    rows are read 3-4x faster so than column by column (docs/benchmarks.md)."""

    def __init__(self, header, body):
        self._index: dict[str, int] = {}
        for j, name in enumerate(header):
            self._index.setdefault(name, j)
        self._body = body
        self._built: dict[str, list] = {}

    def __getitem__(self, name) -> list:
        column = self._built.get(name)
        if column is None:
            j = self._index[name]
            column = self._built[name] = [row[j] for row in self._body]
        return column

    def __contains__(self, name) -> bool:
        return name in self._index

    def __iter__(self):
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def cells(self, names, keep) -> list:
        """The cells of columns ``names`` in rows ``keep``, row by row (row-major)."""
        positions = [self._index[name] for name in names]
        if not positions:
            return []
        if len(positions) == 1:
            j = positions[0]
            return [self._body[i][j] for i in keep]
        get, body = operator.itemgetter(*positions), self._body
        return [cell for i in keep for cell in get(body[i])]


def _read_parquet(path: Path, raw: bytes | None = None) -> Table:
    import pyarrow as pa  # only sites with Parquet files need pyarrow loaded
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path if raw is None else pa.BufferReader(raw))
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


def _number(value) -> float | None:
    """``value`` as a finite float, or None (missing, not a number, NaN or infinite)."""
    if value is None or isinstance(value, bool):
        return None if value is None else float(value)
    if isinstance(value, (int, float)):
        v = float(value)
    elif isinstance(value, str):
        try:
            v = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return v if math.isfinite(v) else None


# Why a row is left out, in the order reports list them (RowAudit.by_reason). A row may have
# several (a missing target and a text feature): it is counted under each.
MISSING = "missing value"         # empty, NA, n/a, nan, null, none (MISSING_MARKERS), None
NOT_A_NUMBER = "not a number"     # text, or bytes that are not UTF-8
NOT_FINITE = "not finite"         # inf, -inf, -nan, 1e999
MALFORMED = "malformed line"      # the wrong number of fields, or a line csv cannot parse
MISSING_ID = "missing id"
REPEATED_ID = "repeated id"       # every row of an id that repeats
REASONS = (MISSING, NOT_A_NUMBER, NOT_FINITE, MALFORMED, MISSING_ID, REPEATED_ID)


def cell_problem(value) -> str | None:
    """Why a cell cannot serve as a number (one of REASONS), or None if it can (``_number``
    gives a finite float exactly when this gives None)."""
    if _number(value) is not None:
        return None
    if _is_missing(value):
        return MISSING
    if isinstance(value, float):
        return NOT_FINITE
    if isinstance(value, str):
        try:
            float(value.strip())
        except ValueError:
            return NOT_A_NUMBER
        return NOT_FINITE
    return NOT_A_NUMBER


@dataclass(frozen=True)
class RowAudit:
    """Which rows of a table a round with some columns uses, and why the others are left out
    (the row-wise rules of the module docstring). Counts and file-column names only: no value
    of the file. For the site's own eyes (its log, ``dpfed site check``), never sent."""

    rows: int                                 # rows in the file
    used: tuple[int, ...]                     # file rows (0-based) the round uses
    missing_target: int                       # left out only for a missing target (see below)
    by_reason: dict[str, int]                 # reason -> rows with it
    by_column: dict[str, dict[str, int]]      # file column -> reason -> rows
    # The numbers of each audited column (None where the cell is not one), for the round.
    numbers: dict[str, list] | None = None

    @property
    def left_out(self) -> int:
        """Every row left out, a missing target included (each row once)."""
        return self.rows - len(self.used)


def audit_rows(table: Table, columns, *, id_column: str | None = None,
               target_column: str | None = None, keep_numbers: bool = False) -> RowAudit:
    """Apply the row-wise rules to ``columns`` (file column names) of ``table``: a row is used
    when it parses, has a non-missing, non-repeated id (if ``id_column``) and a finite number
    in every one of ``columns``. ``missing_target`` counts the rows left out for a missing
    ``target_column`` that no other rule (a malformed line, an id problem) already left out,
    as ``RoundData.dropped_missing_target``."""
    n = table.n_rows
    flagged = {reason: set() for reason in REASONS}
    flagged[MALFORMED] |= table.malformed
    by_column: dict[str, dict[str, int]] = {}
    if id_column:
        missing_ids, repeated = _id_problems(table, id_column)
        flagged[MISSING_ID] |= missing_ids
        flagged[REPEATED_ID] |= repeated
        counts = {MISSING_ID: len(missing_ids), REPEATED_ID: len(repeated)}
        if any(counts.values()):
            by_column[id_column] = {r: k for r, k in counts.items() if k}
    numbers, missing_target = {}, set()
    for column in dict.fromkeys(columns):
        values = table.columns[column]
        nums, counts = [None] * n, {}
        for i, value in enumerate(values):
            if i in table.malformed:
                continue
            v = _number(value)
            if v is None:
                reason = cell_problem(value)
                flagged[reason].add(i)
                counts[reason] = counts.get(reason, 0) + 1
                if column == target_column and reason == MISSING:
                    missing_target.add(i)
            nums[i] = v
        numbers[column] = nums
        if counts:
            by_column[column] = {r: counts[r] for r in REASONS if r in counts}
    left = set().union(*flagged.values())
    missing_target -= flagged[MISSING_ID] | flagged[REPEATED_ID]
    return RowAudit(rows=n, used=tuple(i for i in range(n) if i not in left),
                    missing_target=len(missing_target),
                    by_reason={r: len(flagged[r]) for r in REASONS if flagged[r]},
                    by_column=by_column, numbers=numbers if keep_numbers else None)


def _checked_round_columns(table: Table, columns: list[str], config: DataConfig,
                           require_ids: bool) -> dict[str, str]:
    """The file column of each spec column a round asks for (``{spec name: file column}``),
    after the column checks ``select_round_data`` and ``select_joint_round_data`` share.

    Raises DataError when a column is missing (the public reason names the spec's column
    names only, never the site's mapping), when a column is not unique, when the round asks
    for the id column (never a feature or a target, even with allowed_features = ["*"]),
    and, with ``require_ids`` (a per-patient budget), when there is no id column or a row's
    id is missing or repeated (``require_patient_ids``).
    """
    names = {name: config.column_for(name) for name in columns}
    missing = [n for n, c in names.items() if c not in table.columns]
    if missing:
        mapped = [f"{n!r}" + (f" (file column {names[n]!r})" if names[n] != n else "")
                  for n in missing]
        # The public reason names the spec's column names only (not the site's mapping).
        raise DataError(f"{table.path}: missing column(s) {', '.join(mapped)}",
                        f"column(s) not available at the site: "
                        f"{', '.join(repr(n) for n in missing)}")
    table.check_unique(set(names.values()) | ({config.id_column} if config.id_column else set()))
    # The id column is never a feature or the target, even with allowed_features = ["*"].
    if config.id_column and config.id_column in names.values():
        raise DataError(f"{table.path}: the round asks for the id column "
                        f"{config.id_column!r} as a feature or target; it is never released",
                        "the round asks for the site's id column, which is never released")
    if require_ids:
        if not config.id_column:
            raise DataError("a per-patient budget needs data.id_column",
                            "the site's per-patient budget has no id column")
        require_patient_ids(table, config.id_column, config.log_patient_ids)
    return names


def _used_ids(table: Table, config: DataConfig, keep) -> tuple:
    """The normalised patient ids of the used rows ``keep`` (``RoundData.ids``); () without
    an id column."""
    if not config.id_column:
        return ()
    from site_node.patients import normalise_id
    id_values = table.columns[config.id_column]
    return tuple(normalise_id(id_values[i]) for i in keep)


def select_round_data(table: Table, features: list[str], target: str,
                      config: DataConfig, *, require_ids: bool = False) -> RoundData:
    """x (features in the given order) and y (target) for one round, as float arrays.

    Rows with a missing target are dropped; rows with any other problem are left out, one row
    at a time (module docstring, ``audit_rows``), and counted in ``left_out``. Only a fault of
    the file or of the columns the round asks for raises DataError.

    ``require_ids`` (a per-patient budget, site_node.patients): every parsed row must carry
    its own patient id; a missing or repeated id raises DataError (``require_patient_ids``)
    instead of leaving rows out, and ``RoundData.ids`` holds the used rows' ids.
    """
    names = _checked_round_columns(table, [*features, target], config, require_ids)
    audit = round_audit(table, features, target, config, keep_numbers=True)
    columns = [audit.numbers[names[f]] for f in features]
    y_values = audit.numbers[names[target]]
    keep = audit.used
    x = np.array([[values[i] for values in columns] for i in keep],
                 dtype=np.float64).reshape(len(keep), len(features))
    y = np.array([y_values[i] for i in keep], dtype=np.float64)
    ids = _used_ids(table, config, keep)
    return RoundData(x=x, y=y, dropped_missing_target=audit.missing_target, rows=keep,
                     first_line=table.first_line,
                     left_out=audit.left_out - audit.missing_target, ids=ids)


def select_joint_round_data(table: Table, features: list[str], targets: list[str],
                            config: DataConfig, *, require_ids: bool = False) -> RoundData:
    """x (features in the given order) and y (n, m: one column per target, NaN where missing)
    for a JOINT round (issue 23; site_node.joint_release).

    A row is used when its features (and id) pass the row-wise rules of ``audit_rows``; its
    responses do not decide that: a response cell that is missing, not a number or not finite
    is NaN for that target only (a cell-wise rule: adding or removing a patient changes no
    other patient's cells). Unknown columns raise DataError whose public reason names the
    spec's column names, never a value; the id column is never a feature or a target.
    ``RoundData.dropped_missing_target`` counts the used rows' missing response cells (for
    the site's own log)."""
    _checked_round_columns(table, [*features, *targets], config, require_ids)
    feature_columns = [config.column_for(f) for f in features]
    audit = audit_rows(table, feature_columns, id_column=config.id_column, keep_numbers=True)
    keep = audit.used
    x = np.array([[audit.numbers[c][i] for c in feature_columns] for i in keep],
                 dtype=np.float64).reshape(len(keep), len(features))
    y = _response_block(table, [config.column_for(t) for t in targets], keep)
    ids = _used_ids(table, config, keep)
    return RoundData(x=x, y=y, dropped_missing_target=int(np.isnan(y).sum()), rows=keep,
                     first_line=table.first_line, left_out=audit.left_out, ids=ids)


_PARSED_TYPES = (str, float, int, bool)


def _response_column(values, keep) -> np.ndarray:
    """The cells ``values[i]`` for i in ``keep`` as float64, NaN where ``_number`` gives None
    (missing, not a number, not finite). Same values as ``_number`` cell by cell, in one tight
    loop: a joint round parses m response columns (262 on GDSC), where ``_number``'s
    per-cell checks cost ~4x more (tests/test_site_joint_release.py compares the two)."""
    out = []
    append, nan = out.append, math.nan
    for i in keep:
        v = values[i]
        if type(v) in _PARSED_TYPES:
            try:
                append(float(v))
                continue
            except ValueError:
                pass
        append(nan)
    column = np.array(out, dtype=np.float64)
    column[~np.isfinite(column)] = nan
    return column


def _response_block(table: Table, columns: list[str], keep) -> np.ndarray:
    """The (len(keep), len(columns)) float64 array of the response ``columns`` (file names)
    in rows ``keep``, NaN where ``_response_column`` gives NaN, the same value elsewhere.
    A text file's cells are read row by row (``TextColumns.cells``) and converted at once as
    ``_text_response_column`` does, column by column (that function, then the generic loop)
    only if some cell is neither a number nor an empty / "NA" cell."""
    y = np.empty((len(keep), len(columns)), dtype=np.float64)
    if isinstance(table.columns, TextColumns) and len(keep) and columns:
        block = _text_cells_as_floats(np.array(table.columns.cells(columns, keep),
                                               dtype=object))
        if block is not None:
            y[:] = block.reshape(y.shape)
            return y
    parse = _text_response_column if isinstance(table.columns, TextColumns) \
        else _response_column
    for j, column in enumerate(columns):
        y[:, j] = parse(table.columns[column], keep)
    return y


def _text_response_column(values, keep) -> np.ndarray:
    """``_response_column`` for the cells of a TEXT table (str; None in a malformed row): the
    kept cells as a numpy object array, empty cells (and "NA") set to "nan", then converted
    by numpy in one C loop that calls float() on each cell (the same parse: float("nan") is
    the NaN ``_response_column`` gives an empty cell); a column with any other cell float()
    refuses is parsed by ``_response_column`` instead. Same values cell by cell
    (tests/test_site_joint_release.py); 2x faster on 262 columns (docs/benchmarks.md)."""
    cells = np.array(values, dtype=object).reshape(-1)[np.asarray(keep, dtype=np.intp)]
    column = _text_cells_as_floats(cells)
    return _response_column(values, keep) if column is None else column


def _text_cells_as_floats(cells: np.ndarray) -> np.ndarray | None:
    """An object array of text cells as float64 (empty and "NA" cells, and non-finite values,
    NaN), by numpy's one C loop of float() per cell; None if float() refuses some cell (the
    caller then parses cell by cell). ``cells`` is modified."""
    for marker in ("", "NA"):
        cells[cells == marker] = "nan"
    try:
        out = cells.astype(np.float64)
    except (ValueError, TypeError):
        return None
    out[~np.isfinite(out)] = math.nan
    return out


def round_audit(table: Table, features, target: str, config: DataConfig, *,
                keep_numbers: bool = False) -> RowAudit:
    """``audit_rows`` for a round's model names (mapped to file columns by the config); the
    caller has checked that the columns exist (``select_round_data``)."""
    return audit_rows(table, [config.column_for(f) for f in [*features, target]],
                      id_column=config.id_column, target_column=config.column_for(target),
                      keep_numbers=keep_numbers)


def _id_problems(table: Table, id_column: str) -> tuple[set[int], set[int]]:
    """(rows without an id, every row whose id repeats): row-wise rules, adding or removing
    one row changes the rows left out here by at most one other row."""
    if id_column not in table.columns:
        raise DataError(f"{table.path}: id column {id_column!r} is missing",
                        f"id column {id_column!r} missing")
    rows: dict = {}
    missing = set()
    for i, v in enumerate(table.columns[id_column]):
        if i in table.malformed:
            continue
        if _is_missing(v):
            missing.add(i)
            continue
        rows.setdefault(v.strip() if isinstance(v, str) else v, []).append(i)
    repeated = {i for same in rows.values() if len(same) > 1 for i in same}
    return missing, repeated


def require_patient_ids(table: Table, id_column: str, log_ids: bool = False) -> None:
    """Contribution bounding for a per-patient budget: at most one row per patient per
    release, and every row a patient to charge. A parsed row without an id, or an id on two
    rows, raises DataError naming the column, the kind and (locally) row numbers and counts;
    never an id (unless the debug switch ``log_ids``). The public reason names the column and
    the kind only (docs/security.md, "What a refusal reveals")."""
    missing, repeated = _id_problems(table, id_column)
    if missing:
        first = min(missing)
        raise DataError(f"{table.path}: {len(missing)} row(s) without a patient id in column "
                        f"{id_column!r} (first at {table.where(first)}); a per-patient budget "
                        f"needs every row's patient",
                        f"rows without a patient id in the id column {id_column!r}")
    if repeated:
        first = min(repeated)
        value = table.columns[id_column][first]
        shown = f" (first: {normalise_id_text(value)!r})" if log_ids else ""
        raise DataError(f"{table.path}: {len(repeated)} row(s) share a patient id with another "
                        f"row in column {id_column!r}{shown}, first at {table.where(first)}; a "
                        f"per-patient budget allows one row per patient",
                        f"repeated patient ids in the id column {id_column!r} (one row per "
                        f"patient)")


def normalise_id_text(value) -> str:
    from site_node.patients import normalise_id
    return normalise_id(value)


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


def load_round_data(config: DataConfig, features: list[str], target: str, *,
                    require_ids: bool = False) -> RoundData:
    """Read the data file and select one round's columns (see select_round_data)."""
    return select_round_data(read_table(config.path, config.format, config.max_bytes),
                             list(features), target, config, require_ids=require_ids)


def load_joint_round_data(config: DataConfig, features: list[str], targets: list[str], *,
                          require_ids: bool = False) -> RoundData:
    """Read the data file and select a joint round's columns (``select_joint_round_data``)."""
    return select_joint_round_data(read_table(config.path, config.format, config.max_bytes),
                                   list(features), list(targets), config,
                                   require_ids=require_ids)


def describe(config: DataConfig) -> dict:
    """Shape of the data file without values, for ``dpfed site check``."""
    table = read_table(config.path, config.format, config.max_bytes)
    table.check_unique()
    if config.id_column:
        _check_ids(table, config.id_column, config.log_patient_ids)
    return {"path": str(table.path), "format": config.format, "rows": table.n_rows,
            "columns": list(table.columns)}
