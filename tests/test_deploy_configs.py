"""The example federation in deploy/three-hospitals parses with the real config loaders, once
the files `dpfed provision --project deploy/three-hospitals/project.toml` makes are put next to
the configs, as deploy/README.md tells operators to do."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import numpy as np
import pytest

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "three-hospitals"
HOSPITALS = ("hospital-a", "hospital-b", "hospital-c")


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """deploy/three-hospitals copied, with each kit's keys/ and tls/ beside its config."""
    from dpfed.provision import kit_dir, load_project, provision

    root = tmp_path_factory.mktemp("deploy")
    example = root / "three-hospitals"
    shutil.copytree(DEPLOY, example)
    out = root / "federation"
    provision(load_project(example / "project.toml"), out)
    for folder, kind, name in [("aggregator", "aggregator", "aggregator"),
                               ("coordinator", "coordinator", "coordinator"),
                               *((h, "site", h) for h in HOSPITALS)]:
        for sub in ("keys", "tls"):
            shutil.copytree(kit_dir(out, kind, name) / sub, example / folder / sub)
    return example, out


def test_project_lists_the_parties_the_configs_use():
    from dpfed.provision import load_project

    project = load_project(DEPLOY / "project.toml")
    assert project.sites == HOSPITALS and project.coordinators == ("coordinator",)
    agg = tomllib.loads((DEPLOY / "aggregator/aggregator.toml").read_text())
    assert [s["site_id"] for s in agg["sites"]] == list(HOSPITALS)
    site = tomllib.loads((DEPLOY / "hospital-a/site.toml").read_text())
    assert site["aggregator"] == project.aggregator_address
    host = project.aggregator_address.rsplit(":", 1)[0]
    assert host in project.hostnames or host in project.ip_addresses
    coord = tomllib.loads((DEPLOY / "coordinator/coordinator.toml").read_text())
    assert coord["aggregator"] == project.aggregator_address
    assert tomllib.loads((DEPLOY / "aggregator/aggregator.toml").read_text())["listen"] == \
        project.listen


def test_round_toml_features_are_in_the_bundled_data():
    """The example round asks for columns `dpfed data export` writes (the public default rule)."""
    from dpfed import datasets

    config = tomllib.loads((DEPLOY / "coordinator/round.toml").read_text())
    assert tuple(config["features"]) == datasets.default_feature_names()
    assert config["target"] == datasets.target_column(1047)
    datasets.drug_dataset(1047, config["features"])     # every feature exists


def test_aggregator_config_loads_with_tls_and_registers_everyone(deployed):
    from aggregator.config import load_config
    from aggregator.registry import Registry

    example, _ = deployed
    config = load_config(example / "aggregator/aggregator.toml")
    assert not config.insecure and config.tls is not None
    for path in (config.tls.ca_cert, config.tls.cert, config.tls.key):
        assert path.is_file()
    registry = Registry.from_config(config)
    assert registry.site_ids() == list(HOSPITALS)
    assert len(registry.coordinator_keys) == 1


@pytest.mark.parametrize("hospital", HOSPITALS)
def test_site_configs_load_with_tls_and_a_matching_certificate(deployed, hospital):
    from dpfed.provision import certificate_problems
    from site_node.config import load_config

    example, _ = deployed
    config = load_config(example / hospital / "site.toml")
    assert config.site_id == hospital and config.tls is not None
    assert certificate_problems(config.tls, "site", hospital) == []
    assert all(p.is_file() for p in config.policy.trusted_coordinators)


def test_coordinator_config_connects_over_tls(deployed):
    import argparse

    from dpfed.commands.round import connect

    example, _ = deployed
    args = argparse.Namespace(config=str(example / "coordinator/coordinator.toml"),
                              aggregator=None, key=None, coordinator_id=None, insecure=False,
                              command="round")
    with connect(args, signing=True) as coordinator:   # no RPC: the channel connects lazily
        assert coordinator.coordinator_id == "coordinator"
        assert coordinator.signing_key is not None


def test_round_toml_builds_a_spec(deployed):
    from coordinator.roundspec import build_round_spec

    example, _ = deployed
    config = tomllib.loads((example / "coordinator/round.toml").read_text())
    # A synthetic stand-in for the public rows the example names.
    rng = np.random.default_rng(0)
    names = [config["target"], *config["features"]]
    rows = [",".join(names)] + [",".join(f"{v:.4f}" for v in rng.normal(size=len(names)))
                                for _ in range(30)]
    (example / "coordinator" / config["public"]["path"]).write_text("\n".join(rows) + "\n")
    # Bounds given: choosing them (dpfed.bounds) is tested elsewhere and not what this checks.
    spec = build_round_spec({**config, "x_bound": 0.3, "y_bound": 2.0},
                            base_dir=example / "coordinator")
    assert list(spec.feature_names) == config["features"] and spec.quorum == 3
