"""A patient's privacy history composed into (eps, delta) (pure functions; issue 23).

Privacy loss is per person (method.md section 13): each patient carries a history of the
releases that included them. This module turns such a history into an (eps, delta) guarantee,
as tightly as the mathematics of its events allows, with no dependency beyond the standard
library (the site enforces the per-patient budget, and a site install never imports SciPy:
pyproject contract ``site-no-fitting``; the core never imports OpenDP or SciPy:
``core-deps``). Google's ``dp-accounting`` (PLD) is the reference it is checked against and the
tight figure an aggregator can report (``aggregator.privacy_report``); it needs SciPy.

Events (``PrivacyEvent``):

- ``PureDP(eps)``: any eps-DP release (today's Laplace / discrete Laplace release of
  (Sxx, Sxy, Syy, n), a distributed discrete Laplace sum with at least T honest shares).
- ``Gaussian(mu)``: a Gaussian mechanism, mu = Delta_2 / sigma (``dpfed.gaussian``).
- ``ZCDP(rho)``: any other rho-zCDP release.
- ``Skellam(lam, l1, l2)``: integer noise Poisson(lam) - Poisson(lam) per coordinate on a
  statistic whose integer L1 / L2 sensitivities (grid units) are l1, l2
  (``dpfed.secagg.skellam``).

Renyi DP curves (eps(alpha) for alpha > 1, Mironov 2017), one per event:

- PureDP: the Renyi divergence of randomized response with parameter eps,

      eps(alpha) = (1/(alpha-1)) log( (e^(alpha eps) + e^((1-alpha) eps)) / (1 + e^eps) ),  (A1)

  the largest Renyi divergence of any eps-DP pair of output laws: every eps-DP mechanism on a
  pair of neighbours is a post-processing of randomized response (Kairouz, Oh & Viswanath,
  ICML 2015, Theorem 2.1 with delta = 0), and Renyi divergences only shrink under
  post-processing. It is <= min(eps, alpha eps^2 / 2) (the latter: Bun & Steinke 2016,
  Proposition 3.3: eps-DP implies (eps^2/2)-zCDP).
- Gaussian: alpha mu^2 / 2 (Mironov 2017, Proposition 7). ZCDP: alpha rho.
- Skellam: for integer alpha > 1 (Agarwal, Kairouz & Liu, NeurIPS 2021, the multidimensional
  Skellam mechanism's RDP bound; written here with lam the mean of each Poisson, the noise's
  variance being 2 lam)

      eps(alpha) <= alpha l2^2 / (4 lam) + min( ((2 alpha - 1) l2^2 + 6 l1) / (16 lam^2),
                                               3 l1 / (4 lam) ),                       (A2)

  used at ceil(alpha) for a fractional alpha (Renyi divergence is non-decreasing in alpha).
  Its first term is the Gaussian of the same variance (mu^2 = l2^2 / (2 lam)); the second
  vanishes like 1/lam.

Composition adds RDP curves (Mironov 2017, Proposition 1), and RDP converts to (eps, delta) by

    eps = eps(alpha) + log((alpha-1)/alpha) - (log delta + log alpha) / (alpha - 1),          (A3)

minimised over a fixed grid of alpha (Balle, Barthe, Gaboardi, Hsu & Sato, AISTATS 2020,
Theorem 21; Canonne, Kamath & Steinke 2020, Proposition 12; the conversion Opacus and
dp-accounting use); delta at a given eps is A3 solved for delta.

``Composition.epsilon(delta)`` returns the smaller of two valid bounds:

1. the RDP route above on the whole history;
2. basic composition of the pure part with the rest: (sum of the PureDP eps) + eps_rest(delta),
   where eps_rest is exact when the rest is Gaussian (the mu-GDP profile of
   ``dpfed.gaussian`` with mu = sqrt(sum mu_i^2): Dong, Roth & Su 2019, Corollary 3.3) and the
   RDP route otherwise. A history of PureDP events only gets exactly sum eps (at delta 0).

Both are upper bounds on the true privacy loss, so the smaller one is too. What the module
guarantees (tests/test_accounting.py): never below the exact value (checked against
dp-accounting's PLD, which for PureDP uses the same worst case, randomized response), exact
for Gaussian-only and PureDP-only histories, and ``admits`` never lets a history past its
budget.

Adaptivity. The composition theorems used hold when the mechanisms are chosen adaptively but
their privacy *parameters* are fixed in advance. When a round's epsilon (or sigma) is chosen
after seeing earlier results, a per-patient budget needs a *filter* (Rogers, Roth, Ullman &
Vadhan 2016): for pure eps the sum is one (basic composition); for RDP at one fixed order
alpha, Feldman & Zrnic (NeurIPS 2021, "Individual privacy accounting via a Renyi filter")
prove the individual Renyi filter; for Gaussians, Smith & Thakurta (2022) the GDP filter
sum mu_i^2 <= mu^2. ``renyi_filter_admits`` is the fixed-order Renyi filter; which one the
per-patient ledger uses is the next session's decision (docs/method.md section 13).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Union

from dpfed.gaussian import compose_mu, gaussian_delta, gaussian_epsilon

__all__ = ["PureDP", "Gaussian", "ZCDP", "Skellam", "PrivacyEvent", "ALPHAS", "rdp",
           "pure_dp_rdp", "skellam_rdp", "rdp_to_epsilon", "rdp_to_delta", "Composition",
           "compose", "admits", "renyi_filter_admits", "renyi_budget"]


def _positive(name: str, value) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return value


@dataclass(frozen=True)
class PureDP:
    """An eps-DP release."""

    epsilon: float

    def __post_init__(self):
        object.__setattr__(self, "epsilon", _positive("epsilon", self.epsilon))


@dataclass(frozen=True)
class Gaussian:
    """A Gaussian mechanism with mu = Delta_2 / sigma (mu-GDP, (mu^2/2)-zCDP)."""

    mu: float

    def __post_init__(self):
        object.__setattr__(self, "mu", _positive("mu", self.mu))

    @classmethod
    def from_sigma(cls, l2_sensitivity: float, sigma: float) -> "Gaussian":
        return cls(_positive("l2_sensitivity", l2_sensitivity) / _positive("sigma", sigma))

    @classmethod
    def from_rho(cls, rho: float) -> "Gaussian":
        return cls(math.sqrt(2.0 * _positive("rho", rho)))

    @property
    def rho(self) -> float:
        return self.mu ** 2 / 2.0


@dataclass(frozen=True)
class ZCDP:
    """A rho-zCDP release (of a mechanism other than a Gaussian)."""

    rho: float

    def __post_init__(self):
        object.__setattr__(self, "rho", _positive("rho", self.rho))


@dataclass(frozen=True)
class Skellam:
    """Skellam noise Poisson(lam) - Poisson(lam) on every coordinate (grid units) of a
    statistic with integer L1 / L2 sensitivities ``l1``, ``l2`` (grid units)."""

    lam: float
    l1: float
    l2: float

    def __post_init__(self):
        for name in ("lam", "l1", "l2"):
            object.__setattr__(self, name, _positive(name, getattr(self, name)))
        if self.l2 > self.l1 * (1 + 1e-12):
            raise ValueError(f"the L2 sensitivity {self.l2} cannot exceed the L1 one {self.l1}")


PrivacyEvent = Union[PureDP, Gaussian, ZCDP, Skellam]

#: Renyi orders of the RDP route (fractional orders help small losses; the large ones pure-eps
#: dominated histories).
ALPHAS = (1.1, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 10.0,
          12.0, 14.0, 16.0, 20.0, 24.0, 28.0, 32.0, 40.0, 48.0, 56.0, 64.0, 80.0, 96.0, 128.0,
          160.0, 192.0, 256.0, 384.0, 512.0, 768.0, 1024.0)


def _check_alpha(alpha) -> float:
    alpha = float(alpha)
    if not (math.isfinite(alpha) and alpha > 1):
        raise ValueError(f"the Renyi order must be finite and > 1, got {alpha!r}")
    return alpha


def pure_dp_rdp(epsilon: float, alpha: float) -> float:
    """eq. A1: the RDP of randomized response, the worst eps-DP pair, in a stable form
    eps + (log1p(e^((1-2 alpha) eps)) - log1p(e^-eps)) / (alpha - 1)."""
    eps = _positive("epsilon", epsilon)
    a = _check_alpha(alpha)
    return max(0.0, eps + (math.log1p(math.exp((1.0 - 2.0 * a) * eps))
                           - math.log1p(math.exp(-eps))) / (a - 1.0))


def skellam_rdp(alpha: float, lam: float, l1: float, l2: float) -> float:
    """eq. A2 (Agarwal, Kairouz & Liu 2021) at the integer order ceil(alpha)."""
    a = math.ceil(_check_alpha(alpha))
    lam, l1, l2 = _positive("lam", lam), _positive("l1", l1), _positive("l2", l2)
    return (a * l2 * l2 / (4.0 * lam)
            + min(((2 * a - 1) * l2 * l2 + 6.0 * l1) / (16.0 * lam * lam), 3.0 * l1 / (4.0 * lam)))


def rdp(event: PrivacyEvent, alpha: float) -> float:
    """The RDP eps(alpha) of one event (module docstring)."""
    alpha = _check_alpha(alpha)
    if isinstance(event, PureDP):
        return pure_dp_rdp(event.epsilon, alpha)
    if isinstance(event, Gaussian):
        return alpha * event.mu ** 2 / 2.0
    if isinstance(event, ZCDP):
        return alpha * event.rho
    if isinstance(event, Skellam):
        return skellam_rdp(alpha, event.lam, event.l1, event.l2)
    raise TypeError(f"not a privacy event: {event!r}")


def _check_delta(delta) -> float:
    delta = float(delta)
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    return delta


def rdp_to_epsilon(curve: Iterable[tuple[float, float]], delta: float) -> float:
    """eq. A3 minimised over the (alpha, eps(alpha)) pairs of ``curve``; >= 0."""
    delta = _check_delta(delta)
    best = math.inf
    for a, r in curve:
        eps = r + math.log1p(-1.0 / a) - (math.log(delta) + math.log(a)) / (a - 1.0)
        best = min(best, eps)
    return max(0.0, best)


def rdp_to_delta(curve: Iterable[tuple[float, float]], epsilon: float) -> float:
    """eq. A3 solved for delta: min over alpha of
    exp((alpha - 1)(eps(alpha) - eps + log(1 - 1/alpha)) - log alpha), capped at 1."""
    epsilon = float(epsilon)
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"epsilon must be finite and >= 0, got {epsilon!r}")
    best = 0.0
    for a, r in curve:
        log_delta = (a - 1.0) * (r - epsilon + math.log1p(-1.0 / a)) - math.log(a)
        best = min(best, log_delta)
    return math.exp(best) if best < 0 else 1.0


@dataclass(frozen=True)
class Composition:
    """A history of events and its (eps, delta) (module docstring)."""

    events: tuple
    alphas: tuple = ALPHAS

    @property
    def pure_epsilon(self) -> float:
        return math.fsum(e.epsilon for e in self.events if isinstance(e, PureDP))

    def _rest(self) -> list:
        return [e for e in self.events if not isinstance(e, PureDP)]

    def rdp_curve(self, events=None) -> list[tuple[float, float]]:
        events = self.events if events is None else events
        return [(a, math.fsum(rdp(e, a) for e in events)) for a in self.alphas]

    def rdp(self, alpha: float) -> float:
        return math.fsum(rdp(e, alpha) for e in self.events)

    def _rest_epsilon(self, rest, delta) -> float:
        if not rest:
            return 0.0
        if all(isinstance(e, Gaussian) for e in rest):
            return gaussian_epsilon(delta, compose_mu([e.mu for e in rest]))
        return rdp_to_epsilon(self.rdp_curve(rest), delta)

    def _rest_delta(self, rest, epsilon) -> float:
        if not rest:
            return 0.0
        if all(isinstance(e, Gaussian) for e in rest):
            return gaussian_delta(epsilon, compose_mu([e.mu for e in rest]))
        return rdp_to_delta(self.rdp_curve(rest), epsilon)

    def epsilon(self, delta: float) -> float:
        """An eps such that the history is (eps, delta)-DP (the smaller of the RDP route and
        pure part + rest; module docstring). 0 for an empty history."""
        delta = _check_delta(delta)
        if not self.events:
            return 0.0
        rest = self._rest()
        hybrid = self.pure_epsilon + self._rest_epsilon(rest, delta)
        return min(hybrid, rdp_to_epsilon(self.rdp_curve(), delta))

    def delta(self, epsilon: float) -> float:
        """A delta such that the history is (eps, delta)-DP; the smaller of the two routes."""
        epsilon = float(epsilon)
        if not (math.isfinite(epsilon) and epsilon >= 0):
            raise ValueError(f"epsilon must be finite and >= 0, got {epsilon!r}")
        if not self.events:
            return 0.0
        rest = self._rest()
        left = epsilon - self.pure_epsilon
        hybrid = self._rest_delta(rest, left) if left >= 0 else 1.0
        return min(hybrid, rdp_to_delta(self.rdp_curve(), epsilon))


def compose(events: Iterable[PrivacyEvent], alphas: tuple = ALPHAS) -> Composition:
    """The composition of a patient's history (in any order)."""
    events = tuple(events)
    for e in events:
        if not isinstance(e, (PureDP, Gaussian, ZCDP, Skellam)):
            raise TypeError(f"not a privacy event: {e!r}")
    alphas = tuple(_check_alpha(a) for a in alphas)
    return Composition(events, alphas)


def admits(history: Iterable[PrivacyEvent], event: PrivacyEvent, epsilon: float,
           delta: float) -> bool:
    """True when history + ``event`` is still (``epsilon``, ``delta``)-DP by ``compose``
    (for parameters fixed in advance; module docstring, "Adaptivity")."""
    epsilon = _positive("epsilon", epsilon)
    return compose([*history, event]).epsilon(delta) <= epsilon


def renyi_budget(epsilon: float, delta: float, alpha: float) -> float:
    """The RDP budget at order alpha that eq. A3 turns into (eps, delta):
    eps - log((alpha-1)/alpha) + (log delta + log alpha) / (alpha - 1). May be <= 0 (no
    event fits at that order)."""
    epsilon, delta, a = _positive("epsilon", epsilon), _check_delta(delta), _check_alpha(alpha)
    return epsilon - math.log1p(-1.0 / a) + (math.log(delta) + math.log(a)) / (a - 1.0)


def renyi_filter_admits(history: Iterable[PrivacyEvent], event: PrivacyEvent, epsilon: float,
                        delta: float, alpha: float) -> bool:
    """The individual Renyi filter at one order ``alpha`` fixed with the budget (Feldman &
    Zrnic 2021): admit when the sum of the events' eps(alpha) stays within
    ``renyi_budget(epsilon, delta, alpha)``. Valid under fully adaptive choice of the events'
    parameters; looser than ``admits`` for histories it was not tuned for."""
    budget = renyi_budget(epsilon, delta, alpha)
    return math.fsum(rdp(e, alpha) for e in [*history, event]) <= budget
