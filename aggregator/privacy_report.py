"""The tight (eps, delta) of a privacy history, by Google's dp-accounting PLD (issue 23).

``dpfed.accounting`` composes a patient's history with pure functions the site can run (no
SciPy there: pyproject contract ``site-no-fitting``), at the price of some looseness for
histories of many pure-eps events (the RDP route: +6 % on 50 events of eps 0.1,
tests/test_accounting.py). For reporting, the aggregator (which installs SciPy) can state the
tight figure: the privacy loss distribution (PLD) accountant of dp-accounting (Koskela,
Jalko & Honkela 2020; Doroshenko, Ghazi, Kamath, Kumar & Manurangsi 2022), whose
pessimistic estimate is an upper bound within its discretisation (1e-4 by default here).

PureDP events enter as their worst case, the randomized response PLD
(``from_privacy_parameters(eps, 0)``: every eps-DP mechanism is a post-processing of it), and
Gaussian events exactly (``from_gaussian_mechanism`` with sensitivity 1 and sigma = 1/mu).
Skellam and generic zCDP events have no PLD here: ``UnsupportedEvent`` (report those with
``dpfed.accounting``). Not wired into any report yet.
"""

from __future__ import annotations

from typing import Iterable

from dp_accounting.pld import common, privacy_loss_distribution as pld

from dpfed.accounting import Gaussian, PrivacyEvent, PureDP

__all__ = ["UnsupportedEvent", "pld_of", "pld_epsilon", "pld_delta"]


class UnsupportedEvent(TypeError):
    """An event this PLD report does not model (Skellam, generic zCDP)."""


def pld_of(events: Iterable[PrivacyEvent], value_discretization_interval: float = 1e-4):
    """The composed ``PrivacyLossDistribution`` of a history (None for an empty one)."""
    out = None
    for e in events:
        if isinstance(e, PureDP):
            p = pld.from_privacy_parameters(common.DifferentialPrivacyParameters(e.epsilon, 0.0),
                                            value_discretization_interval=value_discretization_interval)
        elif isinstance(e, Gaussian):
            p = pld.from_gaussian_mechanism(1.0 / e.mu, sensitivity=1.0,
                                            value_discretization_interval=value_discretization_interval)
        else:
            raise UnsupportedEvent(f"no PLD for {type(e).__name__} events")
        out = p if out is None else out.compose(p)
    return out


def pld_epsilon(events: Iterable[PrivacyEvent], delta: float) -> float:
    """The PLD's (pessimistic) eps at ``delta``; 0 for an empty history."""
    p = pld_of(events)
    return 0.0 if p is None else float(p.get_epsilon_for_delta(delta))


def pld_delta(events: Iterable[PrivacyEvent], epsilon: float) -> float:
    """The PLD's (pessimistic) delta at ``epsilon``; 0 for an empty history."""
    p = pld_of(events)
    return 0.0 if p is None else float(p.get_delta_for_epsilon(epsilon))
