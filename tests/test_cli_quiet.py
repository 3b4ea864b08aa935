"""A quiet, self-describing command line (issue 12): no library INFO lines or warnings unless
asked, --log-level before or after the command, every command described with an example and
no "(default: None)", errors that name the command being run."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from dpfed import exitcodes
from dpfed_apps import cli


def _parsers():
    return list(cli.each_parser(cli.build_parser()))


@pytest.mark.parametrize("parser", [p for p, _ in _parsers()], ids=lambda p: p.prog)
def test_every_command_has_a_description_and_an_example_and_no_none_default(parser):
    text = parser.format_help()
    assert parser.description and parser.description.strip()
    assert "example" in text.lower(), f"{parser.prog} --help shows no example"
    assert "(default: None)" not in text
    assert "(default: False)" not in text


def test_help_shows_meaningful_defaults_once():
    helps = {p.prog: p.format_help() for p, _ in _parsers()}
    assert "(default: 3)" in helps["dpfed simulate"]                  # --sites
    # A help text that names its default is not given a second one.
    start = " ".join(helps["dpfed round start"].split())
    assert start.count("default: deadline + 10 min") == 1
    assert "10 min) (default" not in start


@pytest.mark.parametrize("argv", [
    ["--log-level", "DEBUG", "site", "check", "--config", "x.toml"],
    ["site", "--log-level", "DEBUG", "check", "--config", "x.toml"],
    ["site", "check", "--config", "x.toml", "--log-level", "DEBUG"],
])
def test_log_level_before_or_after_the_command(argv):
    args = cli.build_parser().parse_args(argv)
    assert args.log_level == "DEBUG"
    assert args.command_prog == "dpfed site check"


def test_log_level_default_and_last_word_wins():
    parser = cli.build_parser()
    assert parser.parse_args(["site", "check", "--config", "x"]).log_level == "INFO"
    args = parser.parse_args(["--log-level", "ERROR", "site", "check", "--config", "x",
                              "--log-level", "WARNING"])
    assert args.log_level == "WARNING"


def test_library_loggers_quiet_unless_debug():
    cli.quiet_libraries(logging.INFO)
    assert logging.getLogger("arviz").getEffectiveLevel() == logging.WARNING
    assert logging.getLogger("arviz.preview").getEffectiveLevel() == logging.WARNING
    cli.quiet_libraries(logging.DEBUG)
    assert logging.getLogger("arviz").getEffectiveLevel() == logging.DEBUG
    cli.quiet_libraries(logging.INFO)


def _dpfed(*argv) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    return subprocess.run([sys.executable, "-m", "dpfed_apps", *argv], capture_output=True,
                          text=True, timeout=300, env=env)


# `dpfed aggregator serve` whose command first imports PyMC (and so ArviZ), as a NUTS fit does
# mid-run: the command itself no longer imports it at start (tests/test_start_imports.py).
_SERVE_WITH_PYMC = (
    "import importlib, sys\n"
    "from dpfed_apps import cli\n"
    "from dpfed_apps.commands import aggregator\n"
    "serve = aggregator.serve\n"
    "aggregator.serve = lambda args: (importlib.import_module('pymc'), serve(args))[1]\n"
    "sys.exit(cli.main(sys.argv[1:]))\n")


def test_a_run_that_loads_pymc_and_arviz_prints_no_library_lines(tmp_path):
    """A command that imports PyMC (and so ArviZ) before it reads its config: at the default
    level stderr holds only our own error line; --log-level DEBUG after the command lets the
    library INFO lines through (so they are quietened, not lost)."""
    missing = str(tmp_path / "missing.toml")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}

    def serve(*extra):
        return subprocess.run([sys.executable, "-c", _SERVE_WITH_PYMC, "aggregator", "serve",
                               "--config", missing, *extra], capture_output=True, text=True,
                              timeout=300, env=env)

    quiet = serve()
    assert quiet.returncode == exitcodes.USAGE
    lines = quiet.stderr.strip().splitlines()
    assert lines == [f"dpfed aggregator serve: config file {missing} does not exist"], lines
    loud = serve("--log-level", "DEBUG")
    assert "arviz" in loud.stderr


def test_errors_name_the_command(capsys):
    assert cli.main(["sites", "list"]) == exitcodes.USAGE
    assert capsys.readouterr().err.startswith("dpfed sites list: give --aggregator")
    # An aggregator that is not there: the RPC error names `sites list`, not `round`.
    code = cli.main(["--log-level", "ERROR", "sites", "list", "--aggregator", "127.0.0.1:9",
                     "--insecure"])
    assert code == exitcodes.UNAVAILABLE
    err = capsys.readouterr().err
    assert "dpfed sites list: aggregator said UNAVAILABLE" in err and "dpfed round" not in err
