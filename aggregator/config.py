"""The aggregator's configuration (aggregator.toml, docs/interfaces.md).

Paths in the file are relative to the file's directory, so a federation directory can be
moved as a whole.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from dpfed.audit import default_path as default_audit_path
from dpfed.configkeys import check_keys
from dpfed.transport import TlsFiles


class ConfigError(ValueError):
    """aggregator.toml is missing something or says something impossible."""


# Every key aggregator.toml may have, per table; anything else is an error naming the
# nearest valid key (dpfed.configkeys).
TOP_KEYS = frozenset({"listen", "state_db", "insecure", "tls", "max_clock_skew_s", "sites",
                      "coordinators", "max_workers", "max_streams", "max_concurrent_rpcs",
                      "skip_fit", "grace_s", "signing_key", "audit_log"})
TLS_KEYS = frozenset({"ca_cert", "cert", "key", "crl"})
ENTRY_KEYS = {"sites": frozenset({"site_id", "public_key"}),
              "coordinators": frozenset({"coordinator_id", "public_key"})}


def _check_all_keys(raw: dict) -> None:
    check_keys(raw, TOP_KEYS, ConfigError)
    if isinstance(raw.get("tls"), dict):
        check_keys(raw["tls"], TLS_KEYS, ConfigError, prefix="tls.")
    for table, keys in ENTRY_KEYS.items():
        items = raw.get(table)
        for i, item in enumerate(items if isinstance(items, list) else []):
            if isinstance(item, dict):
                check_keys(item, keys, ConfigError, prefix=f"{table}[{i + 1}].")


@dataclass(frozen=True)
class KeyEntry:
    """A registered party: its id and the path (or PEM bytes) of its Ed25519 public key."""

    party_id: str
    public_key: Path | bytes


@dataclass(frozen=True)
class AggregatorConfig:
    listen: str = "127.0.0.1:50051"
    state_db: Path = Path("aggregator.sqlite")
    insecure: bool = False
    tls: TlsFiles | None = None
    crl: Path | None = None      # [tls] crl: the CA's revocation list (aggregator.identity)
    max_clock_skew_s: float = 300.0
    sites: tuple[KeyEntry, ...] = ()
    coordinators: tuple[KeyEntry, ...] = ()
    # Threads for the round manager's work behind StartRound, Refuse, Subscribe's hello and
    # the read-only calls (which may wait on a disk commit). Contribute is checked on the
    # event loop and committed by the store's writer thread; open round streams wait on the
    # event loop and hold no thread.
    max_workers: int = 64
    # Load shedding (RESOURCE_EXHAUSTED instead of falling over, tests/test_load.py): every
    # RPC in progress, open Subscribe streams included, counts against gRPC's
    # maximum_concurrent_rpcs, which bounds the memory held by requests (4096 x a 17 kB
    # d = 64 contribution = 70 MB); open streams are capped below it so slots always remain
    # for Contribute, GetRound and health checks (0: three quarters of max_concurrent_rpcs).
    max_streams: int = 0
    max_concurrent_rpcs: int = 4096
    # Benchmarks only: close rounds at quorum without fitting, to time the federation alone.
    skip_fit: bool = False
    grace_s: float = 5.0
    # The aggregator's Ed25519 identity key (its kit's keys/aggregator.key from `dpfed
    # provision`): it signs every secure-aggregation message it sends, and the sites check
    # the signature against the key id the coordinator pinned (RoundSpec.aggregator_key_id).
    # None: no secure round can run (StartRound of a secure spec is refused).
    signing_key: Path | None = None
    # The audit log of every round message received and pushed (aggregator.audit, signed
    # with signing_key; none without one). Default: next to state_db.
    audit_log: Path | None = None

    @property
    def audit_path(self) -> Path:
        return self.audit_log or default_audit_path(self.state_db)


def _entries(items, id_key: str, base: Path, what: str) -> tuple[KeyEntry, ...]:
    out, seen = [], set()
    for i, item in enumerate(items or []):
        if not isinstance(item, dict) or id_key not in item or "public_key" not in item:
            raise ConfigError(f"[[{what}]] entry {i + 1} needs {id_key} and public_key")
        party = str(item[id_key])
        if party in seen:
            raise ConfigError(f"[[{what}]] {id_key} {party!r} is listed twice")
        seen.add(party)
        key = item["public_key"]
        key = key.encode() if key.lstrip().startswith("-----BEGIN") else base / key
        out.append(KeyEntry(party, key))
    return tuple(out)


def _tls_files(raw: dict, base: Path, insecure_flag: bool) -> TlsFiles | None:
    """The [tls] table as TlsFiles; None for plaintext, which needs ``insecure = true`` in the
    file or --insecure on the command line (``insecure_flag``, which wins over a [tls] table)."""
    insecure = raw.get("insecure", False)
    if not isinstance(insecure, bool):
        raise ConfigError(f"insecure must be true or false, got {insecure!r}")
    t = raw.get("tls")
    if insecure_flag:
        return None
    if t is None:
        if insecure:
            return None
        raise ConfigError("no [tls] table. Mutual TLS is required: get the aggregator kit from "
                          "`dpfed provision` (its aggregator.toml has the [tls] table with "
                          "ca_cert, cert and key); or, for local tests only, pass --insecure "
                          "or set insecure = true")
    if insecure:
        raise ConfigError("both insecure = true and a [tls] table; choose one")
    if not isinstance(t, dict) or not all(isinstance(t.get(k), str) for k in ("ca_cert", "cert", "key")):
        raise ConfigError("[tls] needs ca_cert, cert and key (paths to PEM files)")
    files = TlsFiles(base / t["ca_cert"], base / t["cert"], base / t["key"])
    for key in ("ca_cert", "cert", "key"):
        if not getattr(files, key).is_file():
            raise ConfigError(f"tls.{key} names {str(getattr(files, key))!r}, which does not exist")
    return files


def _crl_path(raw: dict, base: Path, tls: TlsFiles | None) -> Path | None:
    """[tls] crl: the federation CA's revocation list (`dpfed provision revoke`), optional."""
    crl = (raw.get("tls") or {}).get("crl") if tls is not None else None
    if crl is None:
        return None
    if not isinstance(crl, str):
        raise ConfigError("tls.crl must be a path to the CA's revocation list (crl.pem)")
    path = base / crl
    if not path.is_file():
        raise ConfigError(f"tls.crl names {str(path)!r}, which does not exist (copy "
                          "public/crl.pem of the federation's CA folder there)")
    return path


def _signing_key_path(raw: dict, base: Path) -> Path | None:
    """``signing_key``: the path of the aggregator's Ed25519 private key, optional."""
    key = raw.get("signing_key")
    if key is None:
        return None
    if not isinstance(key, str) or not key:
        raise ConfigError("signing_key must be the path of the aggregator's Ed25519 private key "
                          "(keys/aggregator.key of its kit from `dpfed provision`)")
    path = base / key
    if not path.is_file():
        raise ConfigError(f"signing_key names {str(path)!r}, which does not exist (the "
                          "aggregator kit's keys/aggregator.key from `dpfed provision`)")
    return path


def config_from_dict(raw: dict, base_dir: str | Path = ".", *,
                     insecure: bool = False) -> AggregatorConfig:
    """``insecure``: the command line's --insecure (plaintext even with a [tls] table)."""
    base = Path(base_dir)
    _check_all_keys(raw)
    tls = _tls_files(raw, base, insecure)
    insecure = tls is None
    skew = float(raw.get("max_clock_skew_s", 300))
    if not skew > 0:
        raise ConfigError("max_clock_skew_s must be > 0")
    workers = int(raw.get("max_workers", 64))
    if workers < 2:
        raise ConfigError("max_workers must be >= 2")
    if int(raw.get("max_concurrent_rpcs", 4096)) < 1:
        raise ConfigError("max_concurrent_rpcs must be >= 1")
    return AggregatorConfig(
        listen=str(raw.get("listen", "127.0.0.1:50051")),
        state_db=base / raw.get("state_db", "aggregator.sqlite"),
        insecure=insecure, tls=tls, crl=_crl_path(raw, base, tls), max_clock_skew_s=skew,
        sites=_entries(raw.get("sites"), "site_id", base, "sites"),
        coordinators=_entries(raw.get("coordinators"), "coordinator_id", base, "coordinators"),
        max_workers=int(raw.get("max_workers", 64)),
        max_streams=int(raw.get("max_streams", 0)),
        max_concurrent_rpcs=int(raw.get("max_concurrent_rpcs", 4096)),
        skip_fit=bool(raw.get("skip_fit", False)),
        grace_s=float(raw.get("grace_s", 5.0)),
        signing_key=_signing_key_path(raw, base),
        audit_log=base / raw["audit_log"] if "audit_log" in raw else None,
    )


def load_config(path: str | Path, *, insecure: bool = False) -> AggregatorConfig:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    try:
        return config_from_dict(raw, path.parent, insecure=insecure)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def stream_limit(config: AggregatorConfig) -> int:
    """Open Subscribe streams allowed at once (see AggregatorConfig.max_streams)."""
    if config.max_streams > 0:
        return min(config.max_streams, config.max_concurrent_rpcs)
    return max(1, config.max_concurrent_rpcs * 3 // 4)
