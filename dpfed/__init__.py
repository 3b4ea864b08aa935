"""dpfed: federated, differentially private Bayesian linear regression.

This package is the small core shared by every role: the ``Statistics`` value that
crosses the wire, the public pre-processing, the wire format and the ``dpfed`` CLI.
It imports neither ``site_node`` nor ``aggregator`` at module level, so a hospital that
installs only the site extra never loads PyMC.
"""

from dpfed.statistics import Statistics, exact_statistics

__all__ = ["Statistics", "exact_statistics"]
__version__ = "0.1.0"
