"""Subcommands of the ``dpfed`` CLI, one module each.

Each module defines ``register(subparsers)`` which adds its parser and sets ``func`` to a
callable ``(args) -> int`` returning an exit code from ``dpfed.exitcodes``. Modules import
their heavy dependencies (PyMC, OpenDP, gRPC servers) inside ``func``, so ``dpfed --help``
stays fast and a site installation without the aggregator extra still works.
"""


def add_command(subparsers, name: str, doc: str, *, help: str, epilog: str | None = None):
    """The parser of ``dpfed NAME``, described by the first line of the command module's
    docstring ("dpfed NAME: what it does"), with ``epilog`` (its examples). The help formatter,
    ``--log-level`` after the command and the name errors use are added for every parser by
    dpfed_apps.cli."""
    what = doc.splitlines()[0].split(": ", 1)[1]
    return subparsers.add_parser(name, help=help, description=what[0].upper() + what[1:],
                                 epilog=epilog)
