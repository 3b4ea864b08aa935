"""Writing TOML: the config files the roles read (site.toml, aggregator.toml, round.toml, ...),
when dpfed writes them itself (``dpfed provision``'s kits, ``dpfed simulate``'s federation).

``toml_value`` renders one value as a TOML literal; ``to_toml`` a config of scalars, lists,
tables and arrays of tables (one level deep). Booleans, integers (numpy's too), floats (``repr``,
so they read back exactly; ``inf`` and ``nan`` are TOML floats as well), strings and paths
(basic strings, escaped as TOML requires), lists and tuples. Anything else is a TypeError.
Round trip: ``tomllib.loads(to_toml(c)) == c`` for such configs (tests/test_metrics.py).
"""

from __future__ import annotations

import math
import re
from pathlib import PurePath

import numpy as np

__all__ = ["toml_value", "to_toml"]

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f",
            "\r": "\\r"}
_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f\x7f]')
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _string(s: str) -> str:
    return '"' + _NEEDS_ESCAPE.sub(lambda m: _ESCAPES.get(m.group(), f"\\u{ord(m.group()):04x}"),
                                   s) + '"'


def _key(k) -> str:
    k = str(k)
    return k if _BARE_KEY.match(k) else _string(k)


def toml_value(v) -> str:
    """``v`` as a TOML literal (module docstring)."""
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return repr(f) if math.isfinite(f) else ("nan" if math.isnan(f) else
                                                  "inf" if f > 0 else "-inf")
    if isinstance(v, (str, PurePath)):
        return _string(str(v))
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def to_toml(config: dict) -> str:
    """TOML for a config of scalars, lists, tables and arrays of tables (one level deep)."""
    lines, tables = [], []
    for key, value in config.items():
        if isinstance(value, dict):
            tables.append((f"[{_key(key)}]", value))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            tables.extend((f"[[{_key(key)}]]", v) for v in value)
        else:
            lines.append(f"{_key(key)} = {toml_value(value)}")
    for head, table in tables:
        lines += ["", head] + [f"{_key(k)} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"
