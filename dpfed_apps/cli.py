"""The ``dpfed`` command line: one entry point for sites, the aggregator and coordinators.

Quiet by default: our own INFO logs go to stderr (``--log-level``, before or after the
subcommand), third-party libraries log only warnings and errors (their INFO lines, such as
ArviZ's "arviz_base not installed", only with ``--log-level DEBUG``), and the FutureWarning and
DeprecationWarning noise of the fitting stack (ArviZ, PyMC, PyTensor, Numba, xarray) is
filtered unless Python is run with ``-W`` or ``PYTHONWARNINGS``. dpfed's own warnings are never
filtered.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import warnings

from dpfed import __version__, exitcodes

# Order is the order shown by --help.
COMMANDS = ("simulate", "data", "keygen", "csr", "provision", "bundle", "site", "aggregator",
            "round", "sites", "console", "health", "choose-bounds", "plan", "evaluate", "bench")

DESCRIPTION = """\
Federated, differentially private Bayesian linear regression.

Hospitals run `dpfed site serve`, one aggregator runs `dpfed aggregator serve`, a coordinator
starts rounds with `dpfed round start`. `dpfed simulate` runs a whole federation on this
machine on bundled GDSC data. Each command explains itself: dpfed COMMAND --help.
"""

EPILOG = """\
examples:
  dpfed simulate                                   a federation on this machine, with a report
  dpfed site check --config site.toml              a hospital checks its kit; releases nothing
  dpfed round start --spec round.toml --config coordinator.toml --wait --log-level WARNING

exit codes: 0 ok, 1 error, 2 usage or config error, 3 round failed, 4 refused,
            5 peer unreachable, 6 optional extra not installed, 7 audit log broken,
            130 interrupted
"""

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_LEVEL_HELP = "how much the logs (on stderr) say; before or after the command (default: INFO)"

# Third-party loggers that speak at INFO on import or per fit; WARNING unless --log-level DEBUG.
NOISY_LOGGERS = ("arviz", "pymc", "pytensor", "numba", "xarray", "matplotlib", "distributed",
                 "asyncio", "grpc")
# Libraries whose FutureWarning / DeprecationWarning are theirs to fix, not the user's.
NOISY_WARNING_MODULES = r"(arviz|pymc|pytensor|numba|xarray|pandas)(\.|$)"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written (examples keep their layout); an option's default is
    appended as "(default: X)" only when X says something (not None, False or an empty list)
    and the help text does not already name the default."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (not action.option_strings or "default" in text.lower() or "%(default)" in text
                or default is None or default is False or default == [] or
                default is argparse.SUPPRESS):
            return text
        return text + " (default: %(default)s)"
class MissingExtra(RuntimeError):
    """A command needs an install extra (e.g. dpfed[aggregator]) that is not installed."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpfed", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"dpfed {__version__}")
    parser.add_argument("--log-level", default="INFO", choices=LOG_LEVELS, help=LOG_LEVEL_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module_name = "dpfed_apps.commands." + name.replace("-", "_")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue  # command not built yet
            raise
        module.register(sub)
    _finish(parser)
    return parser


def each_parser(parser: argparse.ArgumentParser):
    """``parser`` and every parser below it (``dpfed``, ``dpfed site``, ``dpfed site serve``, ...),
    each with the one-line help its parent lists it with (None for the top)."""
    stack = [(parser, None)]
    while stack:
        p, summary = stack.pop(0)
        yield p, summary
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help for a in action._choices_actions}
                stack.extend((child, helps.get(name)) for name, child in action.choices.items())


def _finish(parser: argparse.ArgumentParser) -> None:
    """What every command shares: dpfed's help formatter, a description (the one-line help the
    parent lists, if the command wrote none), --log-level after the command as well as before
    it, and ``args.command_prog`` ("dpfed sites list") for error messages."""
    for p, summary in each_parser(parser):
        p.formatter_class = HelpFormatter
        if p is not parser:
            if not p.description and summary:
                p.description = summary[0].upper() + summary[1:] + "."
            # SUPPRESS: absent after the command, the value given before it (or INFO) stays.
            p.add_argument("--log-level", default=argparse.SUPPRESS, choices=LOG_LEVELS,
                           help=LOG_LEVEL_HELP)
        p.set_defaults(command_prog=p.prog)


def quiet_libraries(level: int) -> None:
    """Third-party INFO logs off unless ``level`` is DEBUG; their Future/DeprecationWarnings off
    unless the user asked for warnings with -W or PYTHONWARNINGS (module docstring)."""
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if level <= logging.DEBUG else
                                         max(level, logging.WARNING))
    if not sys.warnoptions:
        for category in (FutureWarning, DeprecationWarning, PendingDeprecationWarning):
            warnings.filterwarnings("ignore", category=category, module=NOISY_WARNING_MODULES)


def command_prog(args) -> str:
    """The command being run, as error messages name it: "dpfed sites list"."""
    return getattr(args, "command_prog", "dpfed")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = getattr(logging, args.log_level)
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_libraries(level)
    if not getattr(args, "func", None):
        parser.print_help()
        return exitcodes.USAGE
    try:
        code = int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return exitcodes.INTERRUPTED
    except MissingExtra as exc:
        print(f"{command_prog(args)}: {exc}", file=sys.stderr)
        return exitcodes.MISSING_EXTRA
    if argv is None and getattr(args, "exit_at_once", False):
        exit_at_once(code)
    return code


def exit_at_once(code: int) -> None:
    """End the process now with ``code``, skipping the interpreter's teardown: once a command
    that set ``exit_at_once`` (``set_defaults(exit_at_once=True)``: ``dpfed simulate`` and
    ``dpfed aggregator serve``, which stop their children and close their stores and logs
    themselves) has returned, freeing every module of the fitting stack (NumPy, SciPy,
    Numba/LLVM, gRPC) only costs time: 0.7-1.4 s. Logs and output are flushed first. Only
    from the command line (``main()`` without arguments), never when called in-process."""
    import os

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def require(module: str, extra: str):
    """Import ``module`` or raise MissingExtra naming the pip extra that provides it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise MissingExtra(f"needs {exc.name}, which comes with `pip install dpfed[{extra}]`") from None


def require_installed(module: str, extra: str) -> None:
    """Raise MissingExtra naming the pip extra unless ``module`` is installed, without
    importing it (importlib.util.find_spec): a start-up check for a library that only some
    paths import later (PyMC alone takes seconds to import and the default fit never needs
    it)."""
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):   # a missing parent package, a broken module entry
        found = False
    if not found:
        raise MissingExtra(f"needs {module}, which comes with `pip install dpfed[{extra}]`")


if __name__ == "__main__":
    sys.exit(main())
