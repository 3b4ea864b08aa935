"""Noise calibration on the fixed-point grid: one object that a round computes from public
numbers and that sites and aggregator both use (method.md sections 9 and 10).

``calibrate`` takes the real-unit calibration of a release (``dpfed.sensitivity.noise_calibration``:
L1 sensitivity and epsilon share per part) and returns a ``GridCalibration``:

1. a power-of-two fixed-point scale per part (``fixedpoint.choose_scales``: rounding error of the
   sum <= 2^-20 noise scales, no overflow of 2^63 with 40-scale noise tails, n on the integer grid);
2. the grid sensitivity per part (``fixedpoint.grid_sensitivity``), including the rounding term
   (one grid unit per entry) and, per the named option ``statistics``
   (``fixedpoint.STATISTICS``), the error of how each site computes its sums:
   ``"float"`` (the default), float64 sums over at most ``n_max`` rows, whose error
   ``fixedpoint.float_sum_error_bound`` is the term E; ``"exact"``, the exact integer
   statistics of quantised rows (``dpfed.secagg.exact``), E = 0, so no site's row count enters
   the sensitivity (secure rounds, ``dpfed.secure_round._calibration``);
3. the discrete Laplace scale per part, b = Delta_grid / eps_part, so that T shares make one
   eps_part-DP draw and the parts compose to eps (basic composition, as for independent releases).

A site then releases ``calibration.release_exact(stats)`` (exact statistics) or
``calibration.release(upper_values, n)`` (float sums, ``statistics="float"`` only): its encoded
statistics plus its noise share, ready for ``SiteSession.masked_input``. The aggregator decodes
the unmasked sum with ``decode``, checks it with ``check_sum`` (a sum that may have wrapped
modulo 2^64 is refused: ``row_capacity``) and describes its noise with
``noise_description(contributors)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from dpfed.noise import NoiseDescription
from dpfed.secagg import dlaplace
from dpfed.secagg import fixedpoint as fp
from dpfed.secagg.errors import ParameterError, SumOutOfRange
from dpfed.secagg.exact import ExactStatistics

__all__ = ["GridCalibration", "calibrate"]

_REAL_PARTS = ("xtx", "xty", "yty")


@dataclass(frozen=True)
class GridCalibration:
    """Public, per part: fixed-point ``scales``, ``grid_sensitivities`` and ``grid_noise`` (the
    DL scale b in grid units; None for a part released exactly, n under replace-one);
    ``noise_threshold`` T; ``statistics``, how sites compute what they encode
    (``fixedpoint.STATISTICS``); and what the grid was sized for: ``n_sites`` K, ``n_max``
    rows per site and each part's ``row_bounds`` (``fixedpoint.row_bounds``)."""

    layout: fp.StatisticsLayout
    scales: dict
    grid_sensitivities: dict
    grid_noise: dict
    noise_threshold: int
    statistics: str = "float"
    n_sites: int = 1
    n_max: int = 1
    row_bounds: dict = field(default_factory=dict)

    @property
    def scale_vector(self) -> np.ndarray:
        return self.layout.per_entry(self.scales)

    @property
    def noise_vector(self) -> np.ndarray:
        """Per-entry b (0 where a part has no noise)."""
        return self.layout.per_entry({p: (b or 0.0) for p, b in self.grid_noise.items()})

    def real_noise_scales(self) -> dict:
        """b / s per part: the real-unit scale of one full draw."""
        return {p: None if b is None else b / self.scales[p] for p, b in self.grid_noise.items()}

    def encode(self, upper_values, n) -> np.ndarray:
        """The site's float statistics on the grid, without noise (``statistics="float"``:
        a calibration without the float-error term takes only ``encode_exact``)."""
        if self.statistics != "float":
            raise ParameterError("this grid calibration has no floating-point error term "
                                 f"(statistics={self.statistics!r}): encode exact statistics "
                                 "(dpfed.secagg.exact, encode_exact), not float sums")
        return fp.encode(self.layout.pack(upper_values, n), self.scale_vector)

    def encode_exact(self, stats: ExactStatistics) -> np.ndarray:
        """The site's exact statistics on the grid, without noise: round(s v) per entry
        computed exactly (one rounding), reduced modulo 2^64 with no range check
        (``fixedpoint.encode_integers``: a site with more rows than ``n_max`` is not refused;
        the aggregator's ``check_sum`` catches a sum that wrapped). Valid under either
        ``statistics`` option (E = 0 is the smaller sensitivity)."""
        if not isinstance(stats, ExactStatistics) or stats.d != self.layout.d:
            raise ParameterError(f"expected ExactStatistics of d = {self.layout.d}")
        ints = stats.on_grid(self.scales)
        return fp.encode_integers([v for part in fp.PARTS for v in ints[part]])

    def release(self, upper_values, n) -> np.ndarray:
        """The site's input x_u: its encoded float statistics plus its 1/T noise share."""
        return self.release_many([(upper_values, n)])[0]

    def release_exact(self, stats: ExactStatistics) -> np.ndarray:
        """The site's input x_u: ``encode_exact(stats)`` plus its 1/T noise share (CSPRNG)."""
        return self._with_shares([self.encode_exact(stats)])[0]

    def release_many(self, sites) -> list[np.ndarray]:
        """``[release(upper_values, n) for upper_values, n in sites]`` with every site's noise
        share drawn in one CSPRNG call: the same law (the shares are independent entries of
        one vector), for code that holds several sites' statistics at once (the evaluation's
        simulated rounds). A real site holds only its own and calls ``release``."""
        return self._with_shares([self.encode(upper, n) for upper, n in sites])

    def release_exact_many(self, sites) -> list[np.ndarray]:
        """``[release_exact(stats) for stats in sites]``, the shares drawn in one CSPRNG call
        (as ``release_many``; ``dpfed_apps.evaluation.methods.robust_private.secure_inputs``)."""
        return self._with_shares([self.encode_exact(stats) for stats in sites])

    def _with_shares(self, xs: list) -> list[np.ndarray]:
        """Each encoded vector of ``xs`` plus its own 1/T noise share."""
        b = self.noise_vector
        noisy = b > 0
        shares = np.zeros((len(xs), b.size), dtype=np.int64)
        if xs and noisy.any():
            drawn = dlaplace.noise_share(np.tile(b[noisy], len(xs)), self.noise_threshold)
            shares[:, noisy] = drawn.reshape(len(xs), -1)
        return [fp.add_signed(x, share) for x, share in zip(xs, shares)]

    def decode(self, vector) -> tuple[np.ndarray, float]:
        """(upper values, n) in real units from an unmasked sum."""
        values = fp.decode(vector, self.scale_vector)
        return values[:-1], float(values[-1])

    def _draws(self) -> int:
        """Full noise draws the sum of up to ``n_sites`` contributions holds, at most."""
        return math.ceil(self.n_sites / self.noise_threshold)

    def row_capacity(self) -> int:
        """Rows in all (over every site) that the sum holds without any part wrapping modulo
        2^64 (``fixedpoint.row_capacity``, the smallest over Sxx, Sxy, Syy; n, on scale 1,
        never wraps). About n_sites * n_max at least (the size the grid was checked for; the
        grid noise here includes the rounding term the check did not), usually far more."""
        return min(fp.row_capacity(scale=self.scales[p], row_bound=self.row_bounds[p],
                                   n_sites=self.n_sites, noise_draws=self._draws(),
                                   grid_noise=self.grid_noise[p])
                   for p in ("xtx", "xty", "yty"))

    def headroom(self) -> float:
        """``row_capacity() / (n_sites * n_max)``: how many times the rows the grid was sized
        for it holds before a sum can wrap."""
        return self.row_capacity() / (self.n_sites * self.n_max)

    def check_sum(self, upper, n, *, bound_name: str = "n_max") -> None:
        """Refuse (``SumOutOfRange``) a decoded sum that may have wrapped modulo 2^64 or that
        no honest sites could have sent: n (noisy) above ``row_capacity`` (after allowing
        for its noise tail; n itself is on scale 1 and cannot wrap) or below minus its noise
        tail, or an entry beyond n_upper times its row bound plus the sites' rounding and the
        noise tail (``TAIL_SCALES`` scales per draw, P ~ e^-40). Below the capacity no entry
        can have wrapped, so the first check is complete for overflow; the second catches a
        corrupt contribution. A function of the released sum only (post-processing).
        ``bound_name``: what the message calls n_max (a secure round's ``max_site_rows``)."""
        draws = self._draws()
        b_n = self.grid_noise["n"]
        n_tail = 0.0 if b_n is None else fp.TAIL_SCALES * draws * float(b_n)
        capacity = self.row_capacity()
        n_upper = float(n) + n_tail
        if not (math.isfinite(float(n)) and -n_tail <= float(n) and n_upper <= capacity):
            raise SumOutOfRange(
                f"the sum outgrew the fixed-point grid and is not used: raise {bound_name} to "
                f"at least {math.ceil(max(n_upper, 0.0) / self.n_sites)} rows per site (the "
                f"unmasked n is {float(n):.0f}, noisy; this grid holds {capacity} rows in all "
                f"without wrapping modulo 2^64, {self.headroom():.3g} x {self.n_sites} sites x "
                f"{bound_name} {self.n_max}; the spec check then says whether this epsilon, "
                f"these bounds and sites fit that many rows in 64 bits)")
        upper = np.asarray(upper, dtype=np.float64)
        for part, sl in self.layout.slices().items():
            if part == "n":
                continue
            s, b = self.scales[part], self.grid_noise[part] or 0.0
            limit = (max(n_upper, 0.0) * self.row_bounds[part]
                     + (self.n_sites / 2.0 + fp.TAIL_SCALES * draws * b) / s)
            worst = float(np.max(np.abs(upper[sl]))) if upper[sl].size else 0.0
            if not worst <= limit:
                raise SumOutOfRange(
                    f"the unmasked sum is implausible and is not used: an entry of {part} is "
                    f"{worst:.6g} in magnitude, beyond {limit:.6g} for n <= {n_upper:.0f} "
                    f"rows: a contribution is corrupt or the sum wrapped modulo 2^64 (raise "
                    f"{bound_name} if the sites hold more rows)")

    def noise_description(self, contributors: int, rounding: str = "down") -> NoiseDescription:
        """The ``dpfed.noise`` description of a sum of ``contributors`` releases
        (``dlaplace.DistributedNoise``); raises TooFewSurvivors below T."""
        return dlaplace.describe_sum(self.grid_noise, self.scales, self.noise_threshold,
                                     contributors, rounding)


def calibrate(*, d: int, n_max: int, n_sites: int, x_bound: float, y_bound: float,
              calibration, noise_threshold: int, statistics: str = "float"
              ) -> GridCalibration:
    """A ``GridCalibration`` from a ``dpfed.sensitivity.NoiseCalibration`` (or any object with
    its ``<part>_sensitivity`` / ``<part>_epsilon`` attributes) and public round sizes.

    ``statistics`` (``fixedpoint.STATISTICS``): ``"float"`` (default) when sites encode
    float64 sums, whose summation error over ``n_max`` rows enters the grid sensitivity;
    ``"exact"`` when they encode exact integer statistics (``dpfed.secagg.exact``,
    ``GridCalibration.encode_exact``): no error term, and ``n_max`` only sizes the grid."""
    if not (isinstance(n_max, int) and n_max >= 1):
        raise ParameterError("n_max must be a positive integer")
    if statistics not in fp.STATISTICS:
        raise ParameterError(f"statistics must be one of {', '.join(fp.STATISTICS)}, got "
                             f"{statistics!r}")
    layout = fp.StatisticsLayout(d)
    real_b = {p: getattr(calibration, f"{p}_sensitivity") / getattr(calibration, f"{p}_epsilon")
              for p in _REAL_PARTS}
    n_sens = getattr(calibration, "n_sensitivity", None)
    real_b["n"] = None if n_sens is None else n_sens / calibration.n_epsilon
    scales = fp.choose_scales(d=d, n_max=n_max, n_sites=n_sites, x_bound=x_bound,
                              y_bound=y_bound, noise_scales=real_b,
                              noise_threshold=noise_threshold)
    term = {"xtx": x_bound ** 2, "xty": x_bound * y_bound, "yty": y_bound ** 2}
    sizes = layout.sizes
    sens, noise = {}, {}
    for p in _REAL_PARTS:
        # per-entry error of a sum over n_max rows, summed over the part's entries (L1);
        # n_max + 1 rows covers the neighbour with one more row. 0 for exact statistics.
        err = sizes[p] * fp.sum_error_bound(statistics, n_max + 1, term[p])
        sens[p] = fp.grid_sensitivity(getattr(calibration, f"{p}_sensitivity"), scales[p],
                                      sizes[p], float_error=err)
        noise[p] = dlaplace.grid_noise_scale(sens[p], getattr(calibration, f"{p}_epsilon"))
    if n_sens is None:
        sens["n"], noise["n"] = None, None
    else:
        sens["n"] = fp.grid_sensitivity(n_sens, scales["n"], 1, integer_valued=True)
        noise["n"] = dlaplace.grid_noise_scale(sens["n"], calibration.n_epsilon)
    return GridCalibration(layout, scales, sens, noise, noise_threshold, statistics, n_sites,
                           n_max, fp.row_bounds(x_bound=x_bound, y_bound=y_bound))
