"""The cost of a lone share (benchmarks/lone_share.py, docs/secure_aggregation.md): T = 1 is
the control (a full discrete Laplace draw is exactly eps-DP), and for T > 1 one share alone is
far from eps-DP, which is why a site reveals no unmask share before the checks of the
consistency phase hold."""

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "lone_share", Path(__file__).resolve().parents[1] / "benchmarks" / "lone_share.py")
lone_share = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lone_share)


@pytest.mark.parametrize("eps", [0.5, 1.0])
def test_a_full_draw_is_exactly_eps_dp(eps):
    r = lone_share.lone_share_loss(1, eps, 32)
    assert r["pure_epsilon"] == pytest.approx(eps, abs=1e-3)
    assert r["hockey_stick_delta"] < 1e-4


@pytest.mark.parametrize("T", [2, 5])
def test_one_of_T_shares_is_not_eps_dp(T):
    r = lone_share.lone_share_loss(T, 1.0, 32)
    assert r["pure_epsilon"] > 2.0
    assert r["hockey_stick_delta"] > 0.25
    finer = lone_share.lone_share_loss(T, 1.0, 256)
    assert finer["pure_epsilon"] > r["pure_epsilon"]      # grows with the grid resolution
