"""Subcommands of the ``dpfed`` CLI, one module each.

Each module defines ``register(subparsers)`` which adds its parser and sets ``func`` to a
callable ``(args) -> int`` returning an exit code from ``dpfed.exitcodes``. Modules import
their heavy dependencies (PyMC, OpenDP, gRPC servers) inside ``func``, so ``dpfed --help``
stays fast and a site installation without the aggregator extra still works.
"""
