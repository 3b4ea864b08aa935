"""What the row-wise rules leave out of a site's data file, counted: for ``dpfed site check``
and the report of ``dpfed simulate``.

A round uses the rows that have a finite number in every column it asks for (and a usable id);
every other row is left out on its own (``site_node.data``; docs/method.md, "Which rows are
used"). The count of rows left out depends on the data: it is for the site's own eyes only.
It never goes into a release, a refusal, a message to the aggregator or the round's result;
this module only reads the file and returns counts for the caller to print locally.

``file_audit`` returns counts and column labels only, never a value of the file. A column is
labelled with its header cell only when that name is known outside the file (the site
config, the policy's allowed lists, the round's columns given on the command line), or for
Parquet, or when the caller asks (``name_columns``); otherwise by position ("column 7"),
because in a file without a header row the header cells are the first patient's values
(``site_node.data`` docstring).
"""

from __future__ import annotations

from site_node.config import DataConfig, PolicyConfig
from site_node.data import (MISSING, DataError, Table, _number, audit_rows, cell_problem,
                             read_table)

# Why a column cannot serve a round (``unusable_columns``).
ALL_MISSING = "all missing"          # every cell empty, NA, nan, ...
NO_NUMBER = "no number"              # cells present but none a finite number (text, codes)
CONSTANT = "constant"                # every number the same: a feature that says nothing
UNUSABLE = (ALL_MISSING, NO_NUMBER, CONSTANT)

__all__ = ["ALL_MISSING", "NO_NUMBER", "CONSTANT", "UNUSABLE", "column_verdict", "file_audit",
           "known_columns"]


def column_verdict(table: Table, column: str) -> str | None:
    """ALL_MISSING, NO_NUMBER or CONSTANT for a column no round can use (over the rows that
    parse), None for a usable one or when the file has no rows."""
    seen, missing, cells = set(), 0, 0
    for i, value in enumerate(table.columns[column]):
        if i in table.malformed:
            continue
        cells += 1
        problem = cell_problem(value)
        if problem is None:
            seen.add(_number(value))
        elif problem == MISSING:
            missing += 1
    if cells == 0:
        return None
    if missing == cells:
        return ALL_MISSING
    if not seen:
        return NO_NUMBER
    return CONSTANT if len(seen) == 1 else None


def known_columns(data: DataConfig, policy: PolicyConfig | None = None, names=()) -> set[str]:
    """File column names known outside the data file, which may be printed: the config's
    mapping and id column, the policy's allowed targets and features, and ``names`` (model
    names, mapped by the config)."""
    known = set(data.columns.values())
    if data.id_column:
        known.add(data.id_column)
    listed = [*names]
    if policy is not None:
        listed += [n for n in (*policy.allowed_targets, *policy.allowed_features) if n != "*"]
    return known | {data.column_for(n) for n in listed}


def file_audit(data: DataConfig, *, target: str | None = None, features=None,
               policy: PolicyConfig | None = None, name_columns: bool = False) -> dict:
    """Rows a round would use and rows left out (by reason and column), and unusable
    columns, of the site's data file. With ``target`` (and ``features``, model names as in a
    round spec; default every other usable column) the round's columns; without, every
    usable column but the id column (a round asking for all of them).

    Raises DataError for a fault of the file or of the columns asked for, as a round would.
    """
    if features and not target:
        raise ValueError("features need a target: give the round's target too")
    table = read_table(data.path, data.format, data.max_bytes)
    header = list(table.header) if table.header else list(table.columns)
    known = known_columns(data, policy, [*(features or ()), *([target] if target else [])])

    def label(column: str) -> str:
        if name_columns or not table.first_line or column in known:
            return column
        return f"column {header.index(column) + 1}"

    id_column = data.id_column
    if id_column and id_column not in table.columns:
        raise DataError(f"{table.path}: id column {id_column!r} is missing",
                        f"id column {id_column!r} missing")
    if target:
        names = [*(features or ()), target]
        absent = [n for n in names if data.column_for(n) not in table.columns]
        if absent:
            raise DataError(f"{table.path}: missing column(s) "
                            f"{', '.join(repr(data.column_for(n)) for n in absent)}")
        if id_column and id_column in {data.column_for(n) for n in names}:
            raise DataError(f"{table.path}: the id column {id_column!r} is never a feature or "
                            f"the target")
        table.check_unique({data.column_for(n) for n in names} | {id_column} - {None})
    else:
        table.check_unique()
    candidates = [c for c in table.columns if c != id_column]
    verdicts = {c: column_verdict(table, c) for c in candidates}
    given = set(features or ())
    if target:
        target_column = data.column_for(target)
        if features is None:
            features = [c for c in candidates if c != target_column
                        and verdicts[c] in (None, CONSTANT)]
        columns = [data.column_for(f) for f in features] + [target_column]
    else:
        target_column = None
        columns = [c for c in candidates if verdicts[c] in (None, CONSTANT)]
    audit = audit_rows(table, columns, id_column=id_column, target_column=target_column)
    checked = columns if target else candidates
    left_out = []
    for reason, rows in audit.by_reason.items():
        per_column = {label(c): counts[reason] for c, counts in audit.by_column.items()
                      if reason in counts}
        left_out.append({"reason": reason, "rows": rows, "columns": per_column})
    unusable = [{"column": label(c), "why": verdicts[c]} for c in dict.fromkeys(checked)
                if verdicts.get(c)]
    # Features defaulted from the header are labels too (header cells are not printed).
    plan = ({"target": target, "features": [f if f in given else label(f) for f in features]}
            if target else None)
    shown = {c for e in left_out for c in e["columns"]} | {u["column"] for u in unusable}
    shown |= set(plan["features"]) if plan else set()
    return {
        "path": str(table.path),
        "format": data.format,
        "rows": table.n_rows,
        "columns": len(header),
        "round": plan,
        "columns_used": len(dict.fromkeys(columns)),
        "usable_rows": len(audit.used),
        "left_out_rows": audit.left_out,
        "left_out": left_out,
        "unusable_columns": unusable,
        # Some column above is shown by position, not by name.
        "unnamed_columns": any(c not in table.columns for c in shown),
    }
