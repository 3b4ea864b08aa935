"""The fits a round may ask for: the values of ``RoundSpec.fit_method`` (part of the round's
contract, so in the core): what a coordinator writes, the aggregator checks, ``dpfed simulate
--fit-method`` and the evaluation accept. ``posterior.names.fit_method_options`` turns one into
``posterior.fit_posterior``'s arguments. Importing this costs nothing: a site or coordinator
install, which has no fitting code, builds the command line with it.
"""

from __future__ import annotations

__all__ = ["FIT_METHODS"]

#: The noise-aware fits "auto" (default) = "laplace" and "nuts"; "plug-in-<method>" fits the
#: releases as if exact (the paper's fit; intervals ignore the privacy noise), for comparison.
FIT_METHODS = ("auto", "laplace", "nuts", "plug-in-laplace", "plug-in-advi", "plug-in-nuts",
               "plug-in-fixed")
