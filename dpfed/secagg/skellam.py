"""Distributed Skellam noise for secure rounds: T shares that sum to one Skellam draw (issue 23).

**Why Skellam** (docs/method.md section 13; method.md section 13). A secure round adds each
site's share of the noise inside the masked sum, so the noise law must be one whose shares
add up to the calibrated law. Two integer laws give Gaussian-like (zCDP / RDP) privacy:

- the distributed discrete Gaussian (Kairouz, Liu & Steinke, ICML 2021) is *not* closed under
  summation: a sum of T discrete Gaussians is only close to a discrete Gaussian, and its
  privacy bound carries a correction that grows as the shares' scale shrinks (many sites,
  little noise each); each share needs an exact discrete-Gaussian sampler;
- the Skellam law Sk(lam) = Poisson(lam) - Poisson(lam) (Agarwal, Kairouz & Liu, "The Skellam
  mechanism for differentially private federated learning", NeurIPS 2021) *is* closed: Poisson
  means add, so T shares Poisson(lam/T) - Poisson(lam/T) sum to exactly Sk(lam), with no
  approximation at any T. The privacy bound (``dpfed.accounting.skellam_rdp``, eq. A2) is
  that of the Gaussian of the same variance 2 lam plus a term that vanishes like 1/lam, and
  the sampler is the CSPRNG Poisson sampler that ``dpfed.secagg.dlaplace`` already has and
  tests (inversion below 10, Hormann's PTRS above; every uniform from os.urandom).

Skellam is chosen. Law: P(K = k) = e^(-2 lam) I_|k|(2 lam), mean 0, variance 2 lam; on the
fixed-point grid of ``dpfed.secagg.fixedpoint`` lam is in grid units squared of variance.

**Shares, contributors and colluders.** With threshold T each site adds
Z_u = P_u - P'_u, P_u, P'_u ~ Poisson(lam / T) independent. C contributing shares sum to
Sk(C lam / T): exactly the calibrated law when C = T, more noise when C > T. A colluder knows
(and can subtract) its own share, so with c colluders among the contributors the noise that
protects an honest patient is the sum of the C - c honest shares, Sk((C - c) lam / T): a
Skellam law again, whose privacy is eq. A2 at lam_honest = (C - c) lam / T. Unlike the
distributed discrete Laplace (``dlaplace``: k < T honest shares are not the calibrated law and
carry "no eps-DP guarantee at the calibrated eps", T/k in the ratio near 0), fewer than T
honest shares degrade *gracefully and computably*: eq. A2 with lam_honest, which the
accountant can charge (``DistributedSkellam.privacy_lam``). A round may still refuse to unmask
below T honest shares; the point is that what it would give is known exactly.

**Sensitivity in grid units.** Eq. A2 needs the L1 and L2 sensitivities of the *integer*
vector that is released. The exact secure statistics (``dpfed.secagg.exact``) quantise each
row toward zero to a public power-of-two grid and sum integers, so the integer vector moves by
exactly the quantised row's contribution; its L1 / L2 norms are bounded by the joint formulas
of ``dpfed.joint_sensitivity`` (the quantised row lies in the same box and ball) times each
part's fixed-point scale. That mapping (per-part scales and per-part lam, charged as one
dominating Skellam event) is ``dpfed.secagg.joint_calibration``.

**Sampler accuracy.** As for ``dlaplace``: the Poisson sampler is exact in exact arithmetic;
floating point moves an outcome's probability by a relative ~1e-15, so the total variation of
a share from its law is ~1e-13 or less (an argument, not a proof); tests/test_secagg_skellam.py
checks one share and the sum of T shares by chi-square goodness of fit. Poisson means are
limited to < 2^51 (``dlaplace.sample_poisson``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpfed.accounting import Skellam, skellam_rdp
from dpfed.secagg.dlaplace import sample_poisson
from dpfed.secagg.errors import ParameterError

__all__ = ["LAW", "skellam_variance", "lam_for_variance", "lam_for_rho", "sample_skellam",
           "sample_share", "noise_share", "DistributedSkellam", "skellam_rdp"]

#: The law's name in ``dpfed.noise`` (NoiseTerm "skellam": scale = sd of one full draw).
LAW = "skellam"
_MAX_LAM = 2.0 ** 50


def _check_lam(lam) -> np.ndarray:
    arr = np.asarray(lam, dtype=np.float64)
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ParameterError("the Skellam parameter lam must be finite and > 0")
    if np.any(arr >= _MAX_LAM):
        raise ParameterError(f"lam of {_MAX_LAM:.3g} or more is not supported")
    return arr


def skellam_variance(lam: float) -> float:
    """Var Sk(lam) = 2 lam."""
    return 2.0 * float(_check_lam(lam))


def lam_for_variance(variance: float) -> float:
    """lam = variance / 2."""
    return float(_check_lam(float(variance) / 2.0))


def lam_for_rho(l2_sensitivity: float, rho: float) -> float:
    """lam whose Skellam has the variance of the rho-zCDP Gaussian, sigma^2 = l2^2 / (2 rho):
    lam = l2^2 / (4 rho). Its true RDP is eq. A2 (slightly above alpha rho; the accountant
    charges eq. A2, not rho)."""
    if not (math.isfinite(l2_sensitivity) and l2_sensitivity > 0 and math.isfinite(rho)
            and rho > 0):
        raise ParameterError("l2_sensitivity and rho must be finite and > 0")
    return float(_check_lam(l2_sensitivity ** 2 / (4.0 * rho)))


def sample_skellam(lam, n: int) -> np.ndarray:
    """n independent Sk(lam) variates (lam scalar or per entry), int64."""
    lam = np.broadcast_to(_check_lam(lam), (n,)).astype(np.float64)
    return sample_poisson(lam) - sample_poisson(lam)


def sample_share(lam, n_shares: int, n: int) -> np.ndarray:
    """n independent shares Poisson(lam/T) - Poisson(lam/T), T = ``n_shares``: T of them sum
    to Sk(lam) exactly."""
    if isinstance(n_shares, bool) or not isinstance(n_shares, int) or n_shares < 1:
        raise ParameterError("the number of shares T must be a positive integer")
    lam = _check_lam(lam)
    return sample_skellam(lam / n_shares, n)


def noise_share(grid_lams, n_shares: int) -> np.ndarray:
    """One site's share for a whole vector (``grid_lams``: the per-entry lam of the sum)."""
    lam = np.asarray(grid_lams, dtype=np.float64).ravel()
    return sample_share(lam, n_shares, lam.size)


@dataclass(frozen=True)
class DistributedSkellam:
    """The noise of a secure sum of ``contributors`` shares of Sk(``lam``) with threshold
    ``threshold`` = T, of which ``colluders`` (c) may be known to the adversary."""

    lam: float
    threshold: int
    contributors: int
    colluders: int = 0

    def __post_init__(self):
        _check_lam(self.lam)
        for name in ("threshold", "contributors", "colluders"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ParameterError(f"{name} must be a non-negative integer")
        if self.threshold < 1:
            raise ParameterError("threshold must be >= 1")
        if self.colluders > self.contributors:
            raise ParameterError("more colluders than contributors")

    @property
    def total_lam(self) -> float:
        """lam of the whole sum: C lam / T."""
        return self.contributors * self.lam / self.threshold

    @property
    def honest_lam(self) -> float:
        """lam of the honest shares' sum: (C - c) lam / T (0 when none is honest)."""
        return (self.contributors - self.colluders) * self.lam / self.threshold

    @property
    def complete(self) -> bool:
        """At least T honest shares: the calibrated law (or more) protects every patient."""
        return self.contributors - self.colluders >= self.threshold

    @property
    def variance(self) -> float:
        """Variance of the sum's noise per entry (what the posterior sees): 2 C lam / T."""
        return 2.0 * self.total_lam

    def privacy_lam(self) -> float:
        """The lam the accountant charges: the honest shares' (raises with none honest)."""
        if self.honest_lam <= 0:
            raise ParameterError("no honest share: the sum carries no noise the adversary "
                                 "does not know")
        return self.honest_lam

    def event(self, l1: float, l2: float) -> Skellam:
        """The ``dpfed.accounting.Skellam`` event of this sum for a release of integer
        sensitivities l1, l2 (grid units)."""
        return Skellam(self.privacy_lam(), l1, l2)
