"""The public description of the privacy noise a ``Statistics`` value carries (method.md 8).

A released value is ``r = s + e``: ``s`` the exact statistics of the clipped rows, ``e`` the
mechanism's noise. The *law* and *scale* of ``e`` are public (they follow from epsilon, the
bounds, the split and the neighbouring relation, never from the data), and a noise-aware
posterior needs them: it must know how much of ``r`` is noise. ``NoiseDescription`` records
them per part of the statistics:

- ``xtx``: each of the d(d+1)/2 upper-triangle entries of Sxx (the lower triangle mirrors it);
- ``xty``: each of the d entries of Sxy;
- ``yty``: Syy;
- ``n``: the row count (noisy only under add/remove neighbours, method.md section 9).

Each part is a tuple of ``NoiseTerm(law, scale, draws)``: ``draws`` independent draws of the
law with that scale were added to *every* coordinate of the part (independently per
coordinate). Adding two releases adds their terms; equal (law, scale) terms merge by adding
draws, so K independent site releases of one round sum to one term with ``draws = K``
(method.md section 3), and a secure aggregate with one distributed draw keeps ``draws = 1``.

Three states, never confused (issue 9: "statistics of unknown noise are never silently fitted
as exact"):

- ``EXACT``: a description with no terms (public statistics);
- a description with terms: noisy, of known law;
- ``None`` on a ``Statistics`` value: unknown. ``None`` plus anything is unknown.

Pure values and pure functions; no role imports this module's callers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["NoiseTerm", "NoiseDescription", "EXACT", "LAWS", "GRID_LAWS", "PARTS", "NoiseError",
           "to_proto", "from_proto"]

#: Laws the description can name. ``laplace``: density exp(-|e|/b)/(2b), variance 2 b^2.
#: ``discrete_laplace``: P(e = k g) proportional to exp(-|k| g / b) on the grid g = ``grid``
#: (OpenDP's integer and grid-snapped Laplace, and the secure aggregate of method.md section
#: 10); its variance is given exactly by ``NoiseTerm.variance``. ``gaussian``: sd = scale.
#: ``skellam``: Poisson(lam) - Poisson(lam) on the grid g = ``grid`` (the distributed noise of a
#: secure Gaussian-mechanism round, dpfed.secagg.skellam; Agarwal, Kairouz & Liu, NeurIPS 2021):
#: ``scale`` is the sd of ONE full draw in the statistic's units, sqrt(2 lam) g, so one full
#: draw's variance is scale^2 = 2 lam g^2 exactly; shares (``share`` = T) carry 1/T of it each.
LAWS = ("laplace", "discrete_laplace", "gaussian", "skellam")
#: Laws on a grid (``NoiseTerm.grid`` > 0) and laws whose draw may be split into T shares.
GRID_LAWS = ("discrete_laplace", "skellam")
PARTS = ("xtx", "xty", "yty", "n")


class NoiseError(ValueError):
    """A malformed noise description (unknown law, non-positive scale, bad draws)."""


@dataclass(frozen=True, order=True)
class NoiseTerm:
    """``draws`` independent draws of ``law`` with ``scale`` in every coordinate of a part.

    ``grid`` is the spacing of a discrete law (0 for continuous laws). ``share`` = T > 1 makes
    each of the ``draws`` a 1/T *share* of one draw (secure aggregation with distributed
    noise; defined for the grid laws): for discrete_laplace (dpfed.secagg.dlaplace) the
    difference of two independent NB(1/T, p) variables, so ``draws`` = C shares sum to
    NB(C/T, p) - NB(C/T, p); for skellam (dpfed.secagg.skellam) Poisson(lam/T) -
    Poisson(lam/T), so C shares sum to Sk(C lam/T). Either carries C/T of one draw's variance
    and, once C >= T, at least one full draw."""

    law: str
    scale: float
    draws: int = 1
    grid: float = 0.0
    share: int = 1

    def __post_init__(self):
        if self.law not in LAWS:
            raise NoiseError(f"unknown noise law {self.law!r}; known: {', '.join(LAWS)}")
        try:
            scale, grid = float(self.scale), float(self.grid)
        except (TypeError, ValueError):
            raise NoiseError("noise scale and grid must be numbers") from None
        if not (math.isfinite(scale) and scale > 0):
            raise NoiseError(f"noise scale must be finite and > 0, got {self.scale!r}")
        if not (math.isfinite(grid) and grid >= 0):
            raise NoiseError(f"noise grid must be finite and >= 0, got {self.grid!r}")
        if (self.law in GRID_LAWS) != (grid > 0):
            raise NoiseError(f"a grid is given for {' and '.join(GRID_LAWS)} and only for them")
        if isinstance(self.draws, bool) or not isinstance(self.draws, int) or self.draws < 1:
            raise NoiseError(f"draws must be an integer >= 1, got {self.draws!r}")
        if isinstance(self.share, bool) or not isinstance(self.share, int) or self.share < 1:
            raise NoiseError(f"share must be an integer >= 1, got {self.share!r}")
        if self.share > 1 and self.law not in GRID_LAWS:
            raise NoiseError(f"shares of a draw (share > 1) are defined for "
                             f"{' and '.join(GRID_LAWS)} only")
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "grid", grid)

    def variance(self) -> float:
        """Variance of the term's total noise in one coordinate (all its draws)."""
        if self.law == "laplace":
            one = 2.0 * self.scale ** 2
        elif self.law in ("gaussian", "skellam"):
            # skellam: scale is the sd of one full draw, sqrt(2 lam) * grid (LAWS)
            one = self.scale ** 2
        else:
            # Discrete Laplace on the grid g with P(k) ~ exp(-|k| t), t = g / b:
            # variance g^2 * 2 e^-t / (1 - e^-t)^2 (-> 2 b^2 as g -> 0).
            t = self.grid / self.scale
            q = math.exp(-t)
            one = self.grid ** 2 * 2.0 * q / (1.0 - q) ** 2
        return self.draws * one / self.share

    @property
    def full_draws(self) -> float:
        """Whole draws' worth of noise: ``draws / share`` (C/T for C shares of threshold T)."""
        return self.draws / self.share

    def to_dict(self) -> dict:
        out = {"law": self.law, "scale": self.scale, "draws": self.draws}
        if self.grid:
            out["grid"] = self.grid
        if self.share != 1:
            out["share"] = self.share
        return out

    @classmethod
    def from_dict(cls, obj) -> "NoiseTerm":
        if not isinstance(obj, dict):
            raise NoiseError("a noise term must be a mapping")
        unknown = set(obj) - {"law", "scale", "draws", "grid", "share"}
        if unknown:
            raise NoiseError(f"unknown noise term field(s): {', '.join(sorted(unknown))}")
        try:
            return cls(str(obj["law"]), obj["scale"], int(obj.get("draws", 1)),
                       float(obj.get("grid", 0.0)), int(obj.get("share", 1)))
        except KeyError as exc:
            raise NoiseError(f"noise term lacks {exc.args[0]}") from None


def _merge(a: tuple[NoiseTerm, ...], b: tuple[NoiseTerm, ...]) -> tuple[NoiseTerm, ...]:
    """Terms of the sum of two independent noises: equal (law, scale, grid, share) add draws
    (C shares of threshold T merge into one term of C shares)."""
    counts: dict[tuple[str, float, float, int], int] = {}
    for t in (*a, *b):
        key = (t.law, t.scale, t.grid, t.share)
        counts[key] = counts.get(key, 0) + t.draws
    return tuple(sorted(NoiseTerm(law, scale, draws, grid, share)
                        for (law, scale, grid, share), draws in counts.items()))


@dataclass(frozen=True)
class NoiseDescription:
    """Noise per part (module docstring). Hashable, comparable, ``+`` for sums."""

    xtx: tuple[NoiseTerm, ...] = ()
    xty: tuple[NoiseTerm, ...] = ()
    yty: tuple[NoiseTerm, ...] = ()
    n: tuple[NoiseTerm, ...] = ()

    def __post_init__(self):
        for part in PARTS:
            terms = getattr(self, part)
            if isinstance(terms, NoiseTerm):
                terms = (terms,)
            terms = tuple(terms)
            if not all(isinstance(t, NoiseTerm) for t in terms):
                raise NoiseError(f"{part}: noise terms must be NoiseTerm values")
            object.__setattr__(self, part, _merge(terms, ()))

    @classmethod
    def single(cls, law: str, *, xtx: float, xty: float, yty: float, n: float | None = None,
               draws: int = 1, grid: dict | None = None) -> "NoiseDescription":
        """One draw of ``law`` per part with the given scales (``n=None``: n exact)."""
        grid = grid or {}
        term = lambda part, s: (NoiseTerm(law, s, draws, float(grid.get(part, 0.0))),)  # noqa: E731
        return cls(term("xtx", xtx), term("xty", xty), term("yty", yty),
                   () if n is None else term("n", n))

    @property
    def is_exact(self) -> bool:
        return not (self.xtx or self.xty or self.yty or self.n)

    def variance(self, part: str) -> float:
        """Total noise variance of one coordinate of ``part``."""
        if part not in PARTS:
            raise NoiseError(f"unknown part {part!r}")
        return float(sum(t.variance() for t in getattr(self, part)))

    def variances(self) -> dict[str, float]:
        return {p: self.variance(p) for p in PARTS}

    def draws(self, part: str = "xty") -> int:
        """Independent draws (or shares, ``NoiseTerm.share``) summed in ``part`` (K for K
        independent releases, C for a secure sum of C contributions)."""
        return int(sum(t.draws for t in getattr(self, part)))

    def full_draws(self, part: str = "xty") -> float:
        """Whole draws' worth of noise in ``part``: K for K independent releases, C/T for a
        secure sum of C shares of threshold T."""
        return float(sum(t.full_draws for t in getattr(self, part)))

    def scaled(self, **factors: float) -> "NoiseDescription":
        """The description of the values multiplied part by part (``xty=1/c``, ``yty=1/c**2``):
        every term's scale and grid times the part's factor (> 0), so its variance times the
        factor squared; the law, draws and shares stay. Unnamed parts are unchanged."""
        unknown = set(factors) - set(PARTS)
        if unknown:
            raise NoiseError(f"unknown part(s) {sorted(unknown)}")
        out = {}
        for part in PARTS:
            f = float(factors.get(part, 1.0))
            if not (math.isfinite(f) and f > 0):
                raise NoiseError(f"{part}: the factor must be finite and > 0, got {f!r}")
            out[part] = tuple(NoiseTerm(t.law, t.scale * f, t.draws, t.grid * f, t.share)
                              for t in getattr(self, part))
        return NoiseDescription(**out)

    def repeated(self, k: int) -> "NoiseDescription":
        """The description of the sum of ``k`` independent copies of this noise: every
        term's draws times k (what adding it to itself k - 1 times gives, in one step)."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise NoiseError(f"k must be an integer >= 1, got {k!r}")
        return NoiseDescription(*(tuple(NoiseTerm(t.law, t.scale, t.draws * k, t.grid, t.share)
                                        for t in getattr(self, p)) for p in PARTS))

    def __add__(self, other: "NoiseDescription") -> "NoiseDescription":
        if not isinstance(other, NoiseDescription):
            return NotImplemented
        return NoiseDescription(*(_merge(getattr(self, p), getattr(other, p)) for p in PARTS))

    def to_dict(self) -> dict:
        return {p: [t.to_dict() for t in getattr(self, p)] for p in PARTS}

    @classmethod
    def from_dict(cls, obj) -> "NoiseDescription":
        if not isinstance(obj, dict):
            raise NoiseError("a noise description must be a mapping")
        unknown = set(obj) - set(PARTS)
        if unknown:
            raise NoiseError(f"unknown noise part(s): {', '.join(sorted(unknown))}")
        return cls(*(tuple(NoiseTerm.from_dict(t) for t in obj.get(p, ()) or ()) for p in PARTS))

    def summary(self) -> str:
        """One line for people: 'exact' or the sd of each noisy part."""
        if self.is_exact:
            return "exact"
        parts = [f"{p} sd {math.sqrt(self.variance(p)):.3g} ({_count(getattr(self, p))})"
                 for p in PARTS if getattr(self, p)]
        return ", ".join(parts)


def _count(terms) -> str:
    """'3 draws', or for shares '12 shares of 1/10 draw = 1.2 draws'."""
    whole = sum(t.draws for t in terms if t.share == 1)
    shared = [t for t in terms if t.share != 1]
    out = []
    if whole or not shared:
        out.append(f"{whole} draw{'s' if whole != 1 else ''}")
    for t in shared:
        out.append(f"{t.draws} share{'s' if t.draws != 1 else ''} of 1/{t.share} draw = "
                   f"{t.full_draws:.3g} draw{'s' if t.full_draws != 1 else ''}")
    return " + ".join(out)


#: Exact statistics: no noise at all (public data).
EXACT = NoiseDescription()


def to_proto(noise: NoiseDescription):
    """The ``dpfed.v1.NoiseDescription`` message of ``noise`` (travels in a Contribution)."""
    from dpfed.v1 import dpfed_pb2 as pb

    msg = pb.NoiseDescription()
    for part in PARTS:
        for t in getattr(noise, part):
            getattr(msg, part).add(law=t.law, scale=t.scale, draws=t.draws, grid=t.grid,
                                   share=0 if t.share == 1 else t.share)
    return msg


def from_proto(msg) -> NoiseDescription:
    """Inverse of ``to_proto``; raises NoiseError on a malformed message."""
    return NoiseDescription(*(tuple(NoiseTerm(t.law, t.scale, int(t.draws), t.grid,
                                              int(t.share) or 1)
                                    for t in getattr(msg, part)) for part in PARTS))
