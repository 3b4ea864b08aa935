"""The comparison methods of the evaluation (method.md section 7; paper section 4.5).

``METHODS`` maps each name to a default-configured instance; ``get_method(name, **options)``
returns one, optionally configured (e.g. ``posterior="fixed"``). Every method's module
docstring states its mechanism, sensitivity and constants.
"""

from __future__ import annotations

from dpfed_apps.evaluation.methods.adassp import AdaSSP
from dpfed_apps.evaluation.methods.base import (DEFAULT_DELTA, Method, PrivacySetting, TrainingData)
from dpfed_apps.evaluation.methods.functional_mechanism import FunctionalMechanism
from dpfed_apps.evaluation.methods.nonprivate import NonPrivate
from dpfed_apps.evaluation.methods.nonprivate_robust import NonPrivateRobust
from dpfed_apps.evaluation.methods.output_perturbation import OutputPerturbation
from dpfed_apps.evaluation.methods.private_unclipped import PrivateUnclipped
from dpfed_apps.evaluation.methods.robust_private import RobustPrivate

__all__ = ["METHODS", "get_method", "Method", "PrivacySetting", "TrainingData", "DEFAULT_DELTA"]

_CLASSES = {cls.name: cls for cls in (RobustPrivate, NonPrivate, NonPrivateRobust,
                                      PrivateUnclipped, OutputPerturbation,
                                      FunctionalMechanism, AdaSSP)}

METHODS: dict[str, Method] = {name: cls() for name, cls in _CLASSES.items()}


def get_method(name: str, **options) -> Method:
    """The method called ``name``; ``options`` go to its constructor (ValueError if unknown)."""
    try:
        cls = _CLASSES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown method {name!r}; known: {sorted(_CLASSES)}") from None
    if not options:
        return METHODS[name]
    try:
        return cls(**options)
    except TypeError as exc:
        raise ValueError(f"bad options for {name}: {exc}") from exc
