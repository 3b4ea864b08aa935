"""Strict config keys: every loader (site.toml, aggregator.toml, coordinator.toml, round.toml,
project.toml) rejects a key it does not know, at every level, naming the key and the nearest
valid one. A misspelt key must never be silently ignored: ``min_N = 500`` would leave min_n at
its default and ``id_colum`` would turn off the duplicate-id check (issue 11, finding 4).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping


def unknown_key_problems(raw: Mapping, allowed: Iterable[str], prefix: str = "") -> list[str]:
    """One message per key of ``raw`` not in ``allowed``, e.g.
    ``unknown key 'policy.min_N' (did you mean 'min_n'?)``. ``prefix`` is the dotted table
    name with its trailing dot ("" for the top level)."""
    allowed = sorted(set(allowed))
    problems = []
    for key in raw:
        if key in allowed:
            continue
        near = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
        if not near:  # case-only slips (min_N) score low on short keys
            near = [a for a in allowed if a.lower() == str(key).lower()][:1]
        hint = (f" (did you mean '{prefix}{near[0]}'?)" if near
                else f" (valid keys{' in [' + prefix[:-1] + ']' if prefix else ''}: "
                     f"{', '.join(allowed)})")
        problems.append(f"unknown key '{prefix}{key}'{hint}")
    return problems


def check_keys(raw: Mapping, allowed: Iterable[str], error: type[Exception], where: str = "",
               prefix: str = "") -> None:
    """Raise ``error`` listing every unknown key of ``raw`` (see unknown_key_problems)."""
    problems = unknown_key_problems(raw, allowed, prefix)
    if problems:
        raise error((f"{where}: " if where else "") + "; ".join(problems))
