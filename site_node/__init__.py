"""The site node: everything a hospital runs. Never imports ``aggregator`` or PyMC.

Public API: ``release_statistics`` (the eps-DP release), ``exact_statistics`` (public data
only) and ``Statistics`` (the value that goes on the wire).
"""

from dpfed.preprocess import Preprocessing
from dpfed.statistics import Statistics, exact_statistics
from site_node.release import release_statistics

__all__ = ["release_statistics", "exact_statistics", "Statistics", "Preprocessing"]
