"""dpfed: federated, differentially private Bayesian linear regression.

This package is the core shared by every role (docs/architecture.md): the ``Statistics``
value that crosses the wire, the public pre-processing, the wire format and the mechanism
arithmetic (sensitivities, noise descriptions, clipping bounds). It imports no role
(``site_node``, ``aggregator``, ``coordinator``) and no application (``dpfed_apps``, where the
``dpfed`` command line lives), so a hospital that installs only the site extra never loads
PyMC; the import-linter contracts in pyproject.toml keep it that way.
"""

__all__ = ["Statistics", "exact_statistics"]
__version__ = "0.1.0"


def __getattr__(name: str):
    """``dpfed.Statistics`` and ``dpfed.exact_statistics`` (dpfed.statistics), loaded on first
    use (PEP 562): they need NumPy, and a process that only reads the wire or keeps a log
    (the aggregator's audit writer, aggregator.audit) should not load it at start."""
    if name in __all__:
        from dpfed import statistics
        return getattr(statistics, name)
    raise AttributeError(f"module 'dpfed' has no attribute {name!r}")
