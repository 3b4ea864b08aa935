"""A command whose install extra is missing says which extra to install and exits 6."""

import sys

import pytest

from dpfed import exitcodes
from dpfed_apps import cli


@pytest.mark.parametrize("argv, extra", [
    (["simulate", "--fit-method", "plug-in-fixed"], "dpfed[all]"),
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


def test_choose_bounds_command_json(capsys):
    import json

    from dpfed.bounds import choose_bounds

    assert cli.main(["choose-bounds", "--n", "300", "--d", "5", "--epsilon", "2",
                     "--sigma-y", "2.0", "--datasets", "3", "--noise-draws", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    direct = choose_bounds(300, 5, 2.0, n_datasets=3, n_noise=3)
    assert (out["omega_x"], out["omega_y"]) == (direct.omega_x, direct.omega_y)
    assert out["y_bound"] == direct.omega_y * 2.0
    assert out["x_bound"] == direct.omega_x * 5 ** -0.5


def test_choose_bounds_command_rejects_bad_epsilon(capsys):
    assert cli.main(["choose-bounds", "--n", "300", "--d", "5", "--epsilon", "0"]) == exitcodes.USAGE
    assert "epsilon" in capsys.readouterr().err
