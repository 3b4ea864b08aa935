"""Noise calibration on the fixed-point grid: one object that a round computes from public
numbers and that sites and aggregator both use (method.md sections 9 and 10).

``calibrate`` takes the real-unit calibration of a release (``dpfed.sensitivity.noise_calibration``:
L1 sensitivity and epsilon share per part) and returns a ``GridCalibration``:

1. a power-of-two fixed-point scale per part (``fixedpoint.choose_scales``: rounding error of the
   sum <= 2^-20 noise scales, no overflow of 2^63 with 40-scale noise tails, n on the integer grid);
2. the grid sensitivity per part (``fixedpoint.grid_sensitivity``), including the rounding term
   (one grid unit per entry) and the floating-point error of each site's sums over at most
   ``n_max`` rows (``fixedpoint.float_sum_error_bound``);
3. the discrete Laplace scale per part, b = Delta_grid / eps_part, so that T shares make one
   eps_part-DP draw and the parts compose to eps (basic composition, as for independent releases).

A site then releases ``calibration.release(upper_values, n)`` (its encoded statistics plus its
noise share, ready for ``SiteSession.masked_input``); the aggregator decodes the unmasked sum with
``decode`` and describes its noise with ``noise_description(contributors)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpfed.noise import NoiseDescription
from dpfed.secagg import dlaplace
from dpfed.secagg import fixedpoint as fp
from dpfed.secagg.errors import ParameterError

__all__ = ["GridCalibration", "calibrate"]

_REAL_PARTS = ("xtx", "xty", "yty")


@dataclass(frozen=True)
class GridCalibration:
    """Public, per part: fixed-point ``scales``, ``grid_sensitivities`` and ``grid_noise`` (the
    DL scale b in grid units; None for a part released exactly, n under replace-one);
    ``noise_threshold`` T."""

    layout: fp.StatisticsLayout
    scales: dict
    grid_sensitivities: dict
    grid_noise: dict
    noise_threshold: int

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
        """The site's statistics on the grid, without noise."""
        return fp.encode(self.layout.pack(upper_values, n), self.scale_vector)

    def release(self, upper_values, n) -> np.ndarray:
        """The site's input x_u: its encoded statistics plus its 1/T noise share (CSPRNG)."""
        return self.release_many([(upper_values, n)])[0]

    def release_many(self, sites) -> list[np.ndarray]:
        """``[release(upper_values, n) for upper_values, n in sites]`` with every site's noise
        share drawn in one CSPRNG call: the same law (the shares are independent entries of
        one vector), for code that holds several sites' statistics at once (the evaluation's
        simulated rounds; ``evaluation.methods.robust_private.secure_inputs``). A real site
        holds only its own and calls ``release``."""
        xs = [self.encode(upper, n) for upper, n in sites]
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

    def noise_description(self, contributors: int, rounding: str = "down") -> NoiseDescription:
        """The ``dpfed.noise`` description of a sum of ``contributors`` releases
        (``dlaplace.DistributedNoise``); raises TooFewSurvivors below T."""
        return dlaplace.describe_sum(self.grid_noise, self.scales, self.noise_threshold,
                                     contributors, rounding)


def calibrate(*, d: int, n_max: int, n_sites: int, x_bound: float, y_bound: float,
              calibration, noise_threshold: int) -> GridCalibration:
    """A ``GridCalibration`` from a ``dpfed.sensitivity.NoiseCalibration`` (or any object with
    its ``<part>_sensitivity`` / ``<part>_epsilon`` attributes) and public round sizes."""
    if not (isinstance(n_max, int) and n_max >= 1):
        raise ParameterError("n_max must be a positive integer")
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
        # per-entry float error of a sum over n_max rows, summed over the part's entries (L1);
        # n_max + 1 rows covers the neighbour with one more row
        err = sizes[p] * fp.float_sum_error_bound(n_max + 1, term[p])
        sens[p] = fp.grid_sensitivity(getattr(calibration, f"{p}_sensitivity"), scales[p],
                                      sizes[p], float_error=err)
        noise[p] = dlaplace.grid_noise_scale(sens[p], getattr(calibration, f"{p}_epsilon"))
    if n_sens is None:
        sens["n"], noise["n"] = None, None
    else:
        sens["n"] = fp.grid_sensitivity(n_sens, scales["n"], 1, integer_valued=True)
        noise["n"] = dlaplace.grid_noise_scale(sens["n"], calibration.n_epsilon)
    return GridCalibration(layout, scales, sens, noise, noise_threshold)
