"""JSON for results that may hold NaN, infinities or numpy values: the one sanitiser.

The rule, everywhere dpfed writes JSON (round summaries on the wire and in the aggregator's
store, every ``--json`` of the command line): NaN, +inf and -inf become ``null``. JSON has no
such numbers; Python's ``json`` would write ``NaN``, which strict parsers reject, and a string
such as ``"nan"`` would turn a number field into a text field. numpy scalars and arrays become
plain numbers and lists, tuples become lists, mapping keys become strings; anything else
becomes its ``str``.
"""

from __future__ import annotations

import json
import math

import numpy as np

__all__ = ["jsonable", "dumps"]


def jsonable(obj):
    """``obj`` as plain JSON values, NaN and infinities as None (the module docstring)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (float, np.floating)):
        f = float(obj)
        return f if math.isfinite(f) else None
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, str) or obj is None:
        return obj
    return str(obj)


def dumps(obj, **kwargs) -> str:
    """``json.dumps`` of ``jsonable(obj)``; strict (``allow_nan=False``) by construction."""
    return json.dumps(jsonable(obj), allow_nan=False, **kwargs)
