"""The ``dpfed`` command line: one entry point for sites, the aggregator and coordinators."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from dpfed import __version__, exitcodes

# Order is the order shown by --help.
COMMANDS = ("simulate", "data", "keygen", "csr", "provision", "site", "aggregator", "round", "sites",
            "health", "choose-bounds", "plan", "evaluate", "bench")

DESCRIPTION = """\
Federated, differentially private Bayesian linear regression.

Hospitals run `dpfed site serve`, one aggregator runs `dpfed aggregator serve`, a coordinator
starts rounds with `dpfed round start`. `dpfed simulate` runs a whole federation on this
machine on bundled GDSC data. Each command explains itself: dpfed COMMAND --help.
"""

EPILOG = """\
exit codes: 0 ok, 1 error, 2 usage or config error, 3 round failed, 4 refused,
            5 peer unreachable, 6 optional extra not installed, 130 interrupted
"""


class MissingExtra(RuntimeError):
    """A command needs an install extra (e.g. dpfed[aggregator]) that is not installed."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpfed", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"dpfed {__version__}")
    parser.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="how much the logs (on stderr) say (default: INFO)")
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
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return exitcodes.USAGE
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return exitcodes.INTERRUPTED
    except MissingExtra as exc:
        print(f"dpfed {args.command}: {exc}", file=sys.stderr)
        return exitcodes.MISSING_EXTRA


def require(module: str, extra: str):
    """Import ``module`` or raise MissingExtra naming the pip extra that provides it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise MissingExtra(f"needs {exc.name}, which comes with `pip install dpfed[{extra}]`") from None


if __name__ == "__main__":
    sys.exit(main())
