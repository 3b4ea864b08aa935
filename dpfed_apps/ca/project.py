"""project.toml: the federation and its parties, as the certificate authority reads it."""

from __future__ import annotations

import ipaddress
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from dpfed.configkeys import unknown_key_problems
from dpfed.identity import IdentityError, check_name

CA_DAYS = 3650
DEFAULT_CERT_DAYS = 397          # the CA/Browser Forum ceiling for TLS leaf certificates;
                                 # renew with `dpfed provision renew` (docs/security.md)

DEFAULT_POLICY = {"max_epsilon_per_round": 2.0, "total_epsilon": 10.0, "min_n": 20,
                  "allowed_targets": ["*"], "allowed_features": ["*"]}


class ProvisionError(IdentityError):
    """project.toml is invalid, or DIR holds something that contradicts it."""


def party_name(name: str, what: str) -> str:
    """``name`` if it can name a party, else ProvisionError (dpfed.identity.check_name)."""
    return check_name(name, what, error=ProvisionError)


# Every key project.toml may have, per table; anything else is an error naming the nearest
# valid key (dpfed.configkeys).
PROJECT_KEYS = frozenset({"federation", "sites", "coordinators", "cert_days", "aggregator",
                          "site_policy"})
PROJECT_AGGREGATOR_KEYS = frozenset({"address", "listen", "hostnames", "ip_addresses"})


def _check_project_keys(raw: dict) -> None:
    problems = unknown_key_problems(raw, PROJECT_KEYS)
    if isinstance(raw.get("aggregator"), dict):
        problems += unknown_key_problems(raw["aggregator"], PROJECT_AGGREGATOR_KEYS,
                                         prefix="aggregator.")
    if isinstance(raw.get("site_policy"), dict):
        problems += unknown_key_problems(raw["site_policy"], DEFAULT_POLICY,
                                         prefix="site_policy.")
    for table, id_key in (("sites", "site_id"), ("coordinators", "coordinator_id")):
        items = raw.get(table)
        for i, item in enumerate(items if isinstance(items, list) else []):
            if isinstance(item, dict):
                problems += unknown_key_problems(item, {id_key}, prefix=f"{table}[{i + 1}].")
    if problems:
        raise ProvisionError("project.toml: " + "; ".join(problems))


@dataclass(frozen=True)
class Project:
    """What project.toml says: the federation and its parties."""

    federation: str
    aggregator_address: str                  # host:port that sites and coordinators dial
    listen: str                              # what the aggregator binds
    hostnames: tuple[str, ...] = ("localhost",)
    ip_addresses: tuple[str, ...] = ("127.0.0.1",)
    sites: tuple[str, ...] = ()
    coordinators: tuple[str, ...] = ()
    cert_days: int = DEFAULT_CERT_DAYS
    site_policy: dict = field(default_factory=lambda: dict(DEFAULT_POLICY))

    def with_sites(self, extra: list[str] | tuple[str, ...]) -> "Project":
        sites = list(self.sites)
        for s in extra:
            party_name(s, "site id")
            if s not in sites:
                sites.append(s)
        return Project(self.federation, self.aggregator_address, self.listen, self.hostnames,
                       self.ip_addresses, tuple(sites), self.coordinators, self.cert_days,
                       self.site_policy)


def _ids(raw, key: str, id_key: str) -> tuple[str, ...]:
    """``sites = ["a", "b"]`` or ``[[sites]] site_id = "a"``."""
    items = raw.get(key, [])
    if not isinstance(items, list):
        raise ProvisionError(f"project.toml: {key} must be a list")
    out = []
    for item in items:
        name = item.get(id_key) if isinstance(item, dict) else item
        party_name(name, f"{key} entry")
        if name in out:
            raise ProvisionError(f"project.toml: {key} lists {name!r} twice")
        out.append(name)
    return tuple(out)


def _split_host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ProvisionError(f"project.toml: aggregator.address must be host:port, got {address!r}")
    return host.strip("[]"), int(port)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def project_from_dict(raw: dict) -> Project:
    _check_project_keys(raw)
    federation = raw.get("federation")
    if not isinstance(federation, str) or not federation.strip():
        raise ProvisionError("project.toml: `federation` (the federation's name) is missing")
    agg = raw.get("aggregator", {})
    if not isinstance(agg, dict):
        raise ProvisionError("project.toml: [aggregator] must be a table")
    address = agg.get("address", "localhost:50051")
    if not isinstance(address, str):
        raise ProvisionError("project.toml: aggregator.address must be a string host:port")
    host, port = _split_host_port(address)
    hostnames = list(agg.get("hostnames", ["localhost"]))
    ips = list(agg.get("ip_addresses", ["127.0.0.1"]))
    # The address the parties dial must be in the certificate, or their TLS check fails.
    if _is_ip(host):
        ips = ips if host in ips else [*ips, host]
    elif host not in hostnames:
        hostnames.append(host)
    for h in hostnames:
        if not isinstance(h, str) or not h or _is_ip(h):
            raise ProvisionError(f"project.toml: aggregator.hostnames entry {h!r} is not a DNS name")
    for ip in ips:
        if not isinstance(ip, str) or not _is_ip(ip):
            raise ProvisionError(f"project.toml: aggregator.ip_addresses entry {ip!r} is not an "
                                 "IP address")
    listen = agg.get("listen", f"0.0.0.0:{port}")
    _split_host_port(listen)
    sites = _ids(raw, "sites", "site_id")
    coordinators = _ids(raw, "coordinators", "coordinator_id")
    if not coordinators:
        raise ProvisionError("project.toml: list at least one coordinator (coordinators = "
                             '["coordinator"]): only coordinators start rounds')
    days = raw.get("cert_days", DEFAULT_CERT_DAYS)
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= CA_DAYS:
        raise ProvisionError(f"project.toml: cert_days must be an integer in 1..{CA_DAYS}")
    policy = dict(DEFAULT_POLICY)
    extra = raw.get("site_policy", {})
    if not isinstance(extra, dict) or not extra.keys() <= DEFAULT_POLICY.keys():
        raise ProvisionError(f"project.toml: [site_policy] may set {sorted(DEFAULT_POLICY)}")
    policy.update(extra)
    return Project(federation.strip(), address, listen, tuple(hostnames), tuple(ips), sites,
                   coordinators, days, policy)


def load_project(path: str | Path) -> Project:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProvisionError(f"{path}: project file not found") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ProvisionError(f"{path}: {exc}") from None
    try:
        return project_from_dict(raw)
    except ProvisionError as exc:
        raise ProvisionError(str(exc).replace("project.toml", str(path), 1)) from None
