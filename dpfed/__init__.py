"""dpfed: federated, differentially private Bayesian linear regression.

This package is the core shared by every role (docs/architecture.md): the ``Statistics``
value that crosses the wire, the public pre-processing, the wire format and the mechanism
arithmetic (sensitivities, noise descriptions, clipping bounds). It imports no role
(``site_node``, ``aggregator``, ``coordinator``) and no application (``dpfed_apps``, where the
``dpfed`` command line lives), so a hospital that installs only the site extra never loads
PyMC; the import-linter contracts in pyproject.toml keep it that way.
"""

from dpfed.statistics import Statistics, exact_statistics

__all__ = ["Statistics", "exact_statistics"]
__version__ = "0.1.0"
