"""The aggregator role: verifies and sums the sites' released statistics and fits each
round's posterior with ``posterior.fit_posterior`` (method.md sections 3 and 6; the fit
itself is the ``posterior`` package).
"""
