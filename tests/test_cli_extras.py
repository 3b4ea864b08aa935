"""A command whose install extra is missing says which extra to install and exits 6."""

import sys

import pytest

from dpfed import cli, exitcodes


@pytest.mark.parametrize("argv, extra", [
    (["simulate", "--fit-method", "fixed"], "dpfed[all]"),
    (["aggregator", "serve", "--config", "missing.toml", "--insecure"], "dpfed[aggregator]"),
])
def test_missing_pymc_names_the_extra(monkeypatch, capsys, argv, extra):
    monkeypatch.setitem(sys.modules, "pymc", None)  # import pymc now raises ModuleNotFoundError
    assert cli.main(argv) == exitcodes.MISSING_EXTRA
    err = capsys.readouterr().err
    assert "pymc" in err and extra in err


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for command in ("simulate", "keygen", "provision", "site", "aggregator", "round", "sites",
                    "evaluate", "bench"):
        assert command in out
