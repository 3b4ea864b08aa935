"""The round benchmark runs end to end (tiny sizes; the real figures come from
`dpfed bench round --sites 1000 --dim 64`)."""

from __future__ import annotations

import json

from dpfed.cli import main


def test_bench_round_small(capsys):
    assert main(["bench", "round", "--sites", "5", "--dim", "4", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["sites"] == 5 and result["dim"] == 4 and result["round_s"] > 0
