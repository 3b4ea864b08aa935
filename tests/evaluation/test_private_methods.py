"""Behaviour every private comparison method shares (one test for all, not one per file):
it recovers beta when epsilon is generous, and its output is noisy at small epsilon."""

import numpy as np
import pytest

from dpfed_apps.evaluation.methods.adassp import AdaSSP
from dpfed_apps.evaluation.methods.functional_mechanism import FunctionalMechanism
from dpfed_apps.evaluation.methods.output_perturbation import OutputPerturbation
from dpfed_apps.evaluation.methods.private_unclipped import PrivateUnclipped

METHODS = {
    "adassp": AdaSSP(),
    "functional_mechanism": FunctionalMechanism(),
    "output_perturbation": OutputPerturbation(),
    "private_unclipped": PrivateUnclipped(posterior="plug-in-fixed", draws=200),
}


@pytest.mark.parametrize("name", sorted(METHODS))
def test_recovers_beta_at_generous_epsilon(problem, name):
    beta = METHODS[name].fit(problem.data, problem.setting(epsilon=50.0), seed=0)
    assert problem.spearman(beta) > 0.9


@pytest.mark.parametrize("name", sorted(METHODS))
def test_noise_is_there_at_small_epsilon(problem, name):
    data, setting = problem.small(200), problem.setting(epsilon=1.0)
    a, b = METHODS[name].fit(data, setting, seed=0), METHODS[name].fit(data, setting, seed=0)
    if name == "functional_mechanism":  # its repair must keep the noisy optimum finite
        assert np.all(np.isfinite(a))
    assert not np.allclose(a, b)
