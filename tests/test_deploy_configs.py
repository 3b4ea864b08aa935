"""The example federation in deploy/three-hospitals parses with the real config loaders, once
the files `dpfed provision --project deploy/three-hospitals/project.toml` makes are put next to
the configs, as deploy/README.md tells operators to do."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import numpy as np
import pytest

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "three-hospitals"
HOSPITALS = ("hospital-a", "hospital-b", "hospital-c")


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """deploy/three-hospitals copied, with each kit's keys/ and tls/ beside its config."""
    from dpfed_apps.ca import kit_dir, load_project, provision

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
    from dpfed_apps.ca import load_project

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
    # Its identity key (signs its secure-aggregation messages) is the one the CA recorded.
    from aggregator.server import load_signing_key
    from coordinator.client import load_aggregator_key
    _, out = deployed
    assert load_signing_key(config).key_id == load_aggregator_key(out / "public/aggregator.pub")


@pytest.mark.parametrize("hospital", HOSPITALS)
def test_site_configs_load_with_tls_and_a_matching_certificate(deployed, hospital):
    from dpfed.identity import certificate_problems
    from site_node.config import load_config

    example, _ = deployed
    config = load_config(example / hospital / "site.toml")
    assert config.site_id == hospital and config.tls is not None
    assert certificate_problems(config.tls, "site", hospital) == []
    assert all(p.is_file() for p in config.policy.trusted_coordinators)


def test_coordinator_config_connects_over_tls(deployed):
    import argparse

    from dpfed_apps.commands.round import connect

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


# ---- systemd units and containers (deploy/systemd, deploy/container) ---------------------------

SYSTEMD = DEPLOY.parent / "systemd"
CONTAINER = DEPLOY.parent / "container"
UNITS = ("dpfed-site.service", "dpfed-aggregator.service")
HARDENING = {"ProtectSystem": "strict", "ProtectHome": "true", "PrivateTmp": "true",
             "NoNewPrivileges": "true", "CapabilityBoundingSet": "",
             "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
             "PrivateDevices": "true", "ProtectKernelTunables": "true",
             "RestrictNamespaces": "true", "LockPersonality": "true"}


def unit_settings(path: Path) -> dict[str, list[str]]:
    """Every Key=value of a unit file (a key may repeat)."""
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            key, value = line.split("=", 1)
            out.setdefault(key.strip(), []).append(value.strip())
    return out


@pytest.mark.parametrize("unit", UNITS)
def test_units_run_as_a_created_user_keep_state_outside_etc_and_are_hardened(unit):
    s = unit_settings(SYSTEMD / unit)
    role = unit.removeprefix("dpfed-").removesuffix(".service")
    # The user exists because the shipped sysusers.d snippet creates it.
    assert s["User"] == ["dpfed"] and s["Group"] == ["dpfed"]
    sysusers = [line.split() for line in (SYSTEMD / "dpfed.sysusers.conf").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert ["u", "dpfed"] == sysusers[0][:2]
    # State in /var/lib (StateDirectory), nothing writable under /etc.
    assert s["StateDirectory"] == [f"dpfed-{role}"]
    assert s["CacheDirectory"] == [f"dpfed-{role}"]
    assert s["ConfigurationDirectory"] == [f"dpfed/{role}"]
    assert s["WorkingDirectory"] == [f"/var/lib/dpfed-{role}"]
    assert "ReadWritePaths" not in s
    assert not any("/etc" in v for k in ("WorkingDirectory", "StateDirectory") for v in s[k])
    assert s["ExecStart"] == [f"/opt/dpfed/venv/bin/dpfed {role} serve --config "
                              f"/etc/dpfed/{role}/{role}.toml"]
    for key, value in HARDENING.items():
        assert s.get(key) == [value], key
    assert "@system-service" in s["SystemCallFilter"]
    # numba's JIT needs writable+executable memory: only the site (no fit) forbids it.
    assert s.get("MemoryDenyWriteExecute") == (["true"] if role == "site" else None)


def _exposure(unit: Path) -> float:
    out = subprocess.run(["systemd-analyze", "security", "--offline=true", str(unit)],
                         capture_output=True, text=True, timeout=120)
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", out.stdout + out.stderr)
    assert match, out.stdout + out.stderr
    return float(match.group(1))


@pytest.mark.parametrize("unit", UNITS)
def test_systemd_analyze_security_scores_ok_as_the_readme_says(unit):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian: apt-get install systemd); the "
                    "README's scores were measured with systemd 252")
    score = _exposure(SYSTEMD / unit)
    assert score < 4.0, f"{unit}: exposure {score} (4.0 and above is not OK)"
    readme = (DEPLOY.parent / "README.md").read_text()
    assert f"| {unit} | {score:.1f} | OK |" in readme, f"README's table must say {score:.1f}"


def _mount(spec: str) -> tuple[str, str, str | None]:
    """(source, target, mode) of a short-syntax volume; the source may hold ${VAR:-default}."""
    match = re.fullmatch(r"(.+):(/[^:]+)(?::(ro|rw))?", spec)
    assert match, spec
    return match.group(1), match.group(2), match.group(3)


def test_compose_services_name_files_that_exist():
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((CONTAINER / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"aggregator", "hospital-a", "hospital-b", "hospital-c"}
    roles = {"aggregator": "aggregator", **{h: "site" for h in HOSPITALS}}
    for name, service in services.items():
        role = roles[name]
        # The images of deploy/README.md step 10 (built from bundles), not built by compose.
        assert service["image"] == f"dpfed-{role}" and "build" not in service
        assert (CONTAINER / f"Containerfile.{role}").is_file()
        assert service["command"] == [role, "serve", "--config", f"/etc/dpfed/{role}/{role}.toml"]
        assert service["read_only"] is True and service["cap_drop"] == ["ALL"]
        # The party folder (read-only) is the demo folder of the same name, and its config is
        # there; state (the config's relative state_db) is the only writable mount.
        folder, target, mode = _mount(service["volumes"][0])
        assert folder.endswith(f"/{name}") and target == f"/etc/dpfed/{role}" and mode == "ro"
        assert (DEPLOY / name / f"{role}.toml").is_file()
        state = tomllib.loads((DEPLOY / name / f"{role}.toml").read_text())["state_db"]
        assert state.startswith("state/")
        assert _mount(service["volumes"][1])[1:] == (f"/etc/dpfed/{role}/state", None)
        if role == "site":
            assert service["depends_on"]["aggregator"]["condition"] == "service_healthy"
            assert service["healthcheck"]["test"][1:3] == ["dpfed", "health"]
    for volume in (_mount(v)[0] for s in services.values() for v in s["volumes"]):
        assert "/" in volume or volume in compose["volumes"]
    # The Containerfiles: a well-known base by default (a build argument), and the role's
    # bundle checked and installed with no index; nothing copied from the source folder.
    for role in ("site", "aggregator"):
        text = (CONTAINER / f"Containerfile.{role}").read_text()
        assert "ARG BASE=docker.io/library/python:3.11-slim\nFROM ${BASE}\n" in text
        assert "\nUSER dpfed\n" in text and "--uid 10001" in text
        assert "sha256sum -c --quiet /opt/dpfed/bundle.SHA256SUMS" in text
        assert f'b["role"] == "{role}"' in text
        assert "pip install --no-index --find-links . -r requirements.txt" in text
        assert 'VOLUME ["/var/lib/dpfed"]' in text and "HEALTHCHECK" in text
        # Only the checksums are copied (they key the build cache); the wheels are mounted.
        assert re.findall(r"^(?:COPY|ADD) .*$", text, re.M) == [
            "COPY SHA256SUMS /opt/dpfed/bundle.SHA256SUMS"]


def test_data_export_is_reproducible_and_disjoint(tmp_path, capsys):
    import csv

    from dpfed_apps.cli import main

    argv = ["data", "export", "--drug", "1047", "--sites", "hospital-a,hospital-b,hospital-c",
            "--out"]
    assert main([*argv, str(tmp_path / "one")]) == 0
    assert main([*argv, str(tmp_path / "two")]) == 0
    files = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert files == ["features.txt", "hospital-a.csv", "hospital-b.csv", "hospital-c.csv",
                     "public.csv", "test.csv"]
    ids = {}
    for name in files:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
        if name.endswith(".csv"):
            with (tmp_path / "one" / name).open() as fh:
                rows = list(csv.reader(fh))
            assert rows[0][0] == "COSMIC_ID" and rows[0][-1] == "Drug_1047_IC50"
            ids[name] = {r[0] for r in rows[1:]}
    assert sum(map(len, ids.values())) == len(set().union(*ids.values())) == 846
    assert len(ids["public.csv"]) == 50 and len(ids["test.csv"]) == 100
    assert main([*argv[:-1], "--features", "no_such_mut", "--out", str(tmp_path / "x")]) == 2
    assert "no genomic feature" in capsys.readouterr().err
