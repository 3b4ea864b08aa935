"""The site's configuration file, site.toml (docs/interfaces.md), parsed and validated.

Every error names the file and the key, so a hospital administrator can fix it without reading
code. Relative paths are resolved against the folder of the config file, not the working
directory, so ``dpfed site serve --config /etc/dpfed/site.toml`` means the same thing from
anywhere.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from dpfed.audit import default_path as default_audit_path
from dpfed.configkeys import check_keys
from dpfed.transport import TlsFiles

DATA_FORMATS = ("csv", "tsv", "parquet")
_EXTENSION_FORMATS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".parquet": "parquet",
                      ".pq": "parquet"}


class ConfigError(ValueError):
    """site.toml is missing, unreadable or has an invalid value (the message says which)."""


# Every key site.toml may have, per table; anything else is an error naming the nearest one
# (dpfed.configkeys). [data.columns] maps free model names and is not checked.
TOP_KEYS = frozenset({"site_id", "aggregator", "state_db", "signing_key", "server_name",
                      "insecure", "tls", "data", "policy", "audit_log"})
TLS_KEYS = frozenset({"ca_cert", "cert", "key"})
DATA_KEYS = frozenset({"path", "format", "id_column", "columns", "max_bytes", "log_patient_ids"})
# allow_replace_one: parsed by the neighbouring-relation work (site_node.policy), allowed here.
POLICY_KEYS = frozenset({"trusted_coordinators", "max_epsilon_per_round", "total_epsilon",
                         "min_n", "allowed_targets", "allowed_features", "allow_replace_one",
                         "max_noise_threshold", "min_colluders", "min_contributors",
                         "patient_epsilon", "patient_delta"})


@dataclass(frozen=True)
class DataConfig:
    """Where the private data are and how to read them."""

    path: Path
    format: str
    id_column: str | None = None
    # Model name (as in RoundSpec.target / feature_names) -> column name in the file, for
    # sites whose column headers differ from the federation's names. Unmapped names are used
    # as they are.
    columns: dict[str, str] = field(default_factory=dict)
    # A larger file is refused before a byte is read (site_node.data.read_table): a wrong
    # path or a runaway export must not exhaust the site's memory. [data] max_bytes.
    max_bytes: int = 2 * 1024**3
    # Debug switch ([data] log_patient_ids = true): local error messages and log lines may
    # then quote patient ids (e.g. which id is duplicated). Off by default: the site log
    # names rows by number and columns by name, never a value (tests/test_fail_closed.py).
    log_patient_ids: bool = False

    def column_for(self, name: str) -> str:
        return self.columns.get(name, name)


@dataclass(frozen=True)
class PolicyConfig:
    """What this site agrees to release (checked by site_node.policy)."""

    trusted_coordinators: tuple[Path, ...]
    max_epsilon_per_round: float
    # The site-wide cap on the sum of every release's epsilon; None: no site-wide cap (only
    # with a per-patient budget).
    total_epsilon: float | None
    min_n: int = 20
    allowed_targets: tuple[str, ...] = ("*",)
    allowed_features: tuple[str, ...] = ("*",)
    # A replace-one round releases n exactly (method.md section 9): only if the site opts in.
    allow_replace_one: bool = False
    # Secure aggregation (site_node.policy.check_aggregation). The largest noise threshold T
    # this site accepts: 1, only rounds in which its own share is a full noise draw; a
    # larger T means smaller shares, so more trust that T others add theirs.
    max_noise_threshold: int = 1
    # The fewest colluding sites c the round must tolerate (0: any c the round names). A
    # larger c raises the Shamir threshold and the floor T + c on the contributions summed.
    min_colluders: int = 0
    # The fewest contributions the unmasked sum may hold, compared with
    # dpfed.secure_round.min_contributors(spec) = max(quorum, T + c) (1: any round).
    min_contributors: int = 1
    # The per-patient budget (pure eps; issue 23 part 1, site_node.patients): a release
    # includes only the patients whose own history still admits it. Needs [data] id_column.
    # None: the site-wide budget alone, every usable row in every release.
    patient_epsilon: float | None = None
    # With patient_epsilon: an (eps, delta) per-patient budget (0 < delta < 1), enforced by the
    # individual Renyi filter (site_node.patients.PatientBudget). Needed for Gaussian rounds
    # (RoundSpec.mechanism = "gaussian"); None: a pure-eps budget, which admits Laplace
    # releases only.
    patient_delta: float | None = None


@dataclass(frozen=True)
class SiteConfig:
    site_id: str
    aggregator: str
    state_db: Path
    signing_key: Path
    data: DataConfig
    policy: PolicyConfig
    tls: TlsFiles | None = None
    server_name: str | None = None   # TLS name of the aggregator if it differs from the address
    source: Path | None = None        # the file this came from, for messages
    # Dotted keys the file set (e.g. "policy.min_n"); every other setting is a default
    # (``dpfed site check`` marks them).
    explicit: frozenset[str] = frozenset()
    # The audit log of what the site receives and sends (dpfed.audit; docs/audit.md).
    # Default: next to state_db (ledger.sqlite -> ledger.audit.sqlite).
    audit_log: Path | None = None

    @property
    def audit_path(self) -> Path:
        return self.audit_log or default_audit_path(self.state_db)


def load_config(path: str | Path, *, insecure: bool = False) -> SiteConfig:
    """Read and validate site.toml; raise ConfigError naming the file and key on any problem.
    ``insecure`` (the command line's --insecure) allows plaintext gRPC without a [tls] table."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_config(raw, base_dir=path.resolve().parent, source=path, insecure=insecure)


def parse_config(raw: dict, *, base_dir: Path, source: Path | None = None,
                 insecure: bool = False) -> SiteConfig:
    """Validate an already-parsed site.toml mapping (``base_dir`` anchors relative paths)."""
    where = str(source) if source else "site config"
    check_keys(raw, TOP_KEYS, ConfigError, where)
    for table, keys in (("tls", TLS_KEYS), ("data", DATA_KEYS), ("policy", POLICY_KEYS)):
        if isinstance(raw.get(table), dict):
            check_keys(raw[table], keys, ConfigError, where, prefix=f"{table}.")
    r = _Reader(raw, where, base_dir, prefix="")

    site_id = r.string("site_id")
    aggregator = r.string("aggregator")
    if ":" not in aggregator:
        raise ConfigError(f"{where}: key 'aggregator' must be host:port, got {aggregator!r}")
    state_db = r.path("state_db")
    audit_log = r.path("audit_log") if "audit_log" in raw else default_audit_path(state_db)
    signing_key = r.path("signing_key", must_exist=True)
    cli_insecure = insecure
    insecure = r.boolean("insecure", default=False)
    server_name = r.string("server_name", default=None)

    tls = None
    if "tls" in raw and not cli_insecure:  # --insecure on the command line: plaintext
        t = r.table("tls")
        tls = TlsFiles(ca_cert=t.path("ca_cert", must_exist=True), cert=t.path("cert", must_exist=True),
                       key=t.path("key", must_exist=True))
    if tls is None and not (insecure or cli_insecure):
        raise ConfigError(f"{where}: no [tls] table. Mutual TLS is required: get this site's kit "
                          "from `dpfed provision` (certificate, key and CA) and add [tls] "
                          "ca_cert/cert/key; or, for local tests only, pass --insecure or set "
                          "insecure = true")
    if tls is not None and insecure:
        raise ConfigError(f"{where}: both insecure = true and a [tls] table; choose one")

    d = r.table("data")
    data_path = d.path("path")
    fmt = d.string("format", default=None)
    if fmt is None:
        fmt = _EXTENSION_FORMATS.get(data_path.suffix.lower())
        if fmt is None:
            raise ConfigError(f"{where}: cannot tell the format of data.path {str(data_path)!r} "
                              f"from its extension; set data.format to one of {DATA_FORMATS}")
    fmt = fmt.lower()
    if fmt not in DATA_FORMATS:
        raise ConfigError(f"{where}: data.format must be one of {DATA_FORMATS}, got {fmt!r}")
    columns = {}
    if "columns" in d.raw:
        cols = d.table("columns")
        for name in cols.raw:
            columns[name] = cols.string(name)
    max_bytes = d.integer("max_bytes", default=DataConfig.max_bytes)
    if max_bytes < 1:
        raise ConfigError(f"{where}: data.max_bytes must be >= 1, got {max_bytes}")
    data = DataConfig(path=data_path, format=fmt, id_column=d.string("id_column", default=None),
                      columns=columns, max_bytes=max_bytes,
                      log_patient_ids=d.boolean("log_patient_ids", default=False))

    p = r.table("policy")
    trusted = p.string_list("trusted_coordinators")
    if not trusted:
        raise ConfigError(f"{where}: policy.trusted_coordinators must name at least one public key")
    trusted_paths = tuple(p.resolve(t, "trusted_coordinators", must_exist=True) for t in trusted)
    max_eps = p.positive_number("max_epsilon_per_round")
    patient_eps = p.positive_number("patient_epsilon") if "patient_epsilon" in p.raw else None
    if patient_eps is None or "total_epsilon" in p.raw:
        total_eps = p.positive_number("total_epsilon")
    else:
        total_eps = None   # a per-patient budget without a site-wide cap
    if total_eps is not None and max_eps > total_eps:
        raise ConfigError(f"{where}: policy.max_epsilon_per_round ({max_eps}) exceeds "
                          f"policy.total_epsilon ({total_eps})")
    if patient_eps is not None:
        if max_eps > patient_eps:
            raise ConfigError(f"{where}: policy.max_epsilon_per_round ({max_eps}) exceeds "
                              f"policy.patient_epsilon ({patient_eps}): such a round could "
                              f"include no patient")
        if not data.id_column:
            raise ConfigError(f"{where}: policy.patient_epsilon needs data.id_column: the "
                              f"per-patient budget is kept by patient id")
    patient_delta = None
    if "patient_delta" in p.raw:
        if patient_eps is None:
            raise ConfigError(f"{where}: policy.patient_delta needs policy.patient_epsilon: "
                              f"the per-patient budget is (patient_epsilon, patient_delta)")
        patient_delta = p.positive_number("patient_delta")
        if not patient_delta < 1:
            raise ConfigError(f"{where}: policy.patient_delta must be in (0, 1), got "
                              f"{patient_delta}")
    min_n = p.integer("min_n", default=20)
    if min_n < 1:
        raise ConfigError(f"{where}: policy.min_n must be >= 1, got {min_n}")
    max_t = p.integer("max_noise_threshold", default=1)
    if max_t < 1:
        raise ConfigError(f"{where}: policy.max_noise_threshold must be >= 1, got {max_t}")
    min_c = p.integer("min_colluders", default=PolicyConfig.min_colluders)
    if min_c < 0:
        raise ConfigError(f"{where}: policy.min_colluders must be >= 0, got {min_c}")
    min_k = p.integer("min_contributors", default=PolicyConfig.min_contributors)
    if min_k < 1:
        raise ConfigError(f"{where}: policy.min_contributors must be >= 1, got {min_k}")
    policy = PolicyConfig(
        trusted_coordinators=trusted_paths, max_epsilon_per_round=max_eps, total_epsilon=total_eps,
        min_n=min_n,
        allowed_targets=tuple(p.string_list("allowed_targets", default=["*"])),
        allowed_features=tuple(p.string_list("allowed_features", default=["*"])),
        allow_replace_one=p.boolean("allow_replace_one", default=False),
        max_noise_threshold=max_t, min_colluders=min_c, min_contributors=min_k,
        patient_epsilon=patient_eps, patient_delta=patient_delta)
    explicit = frozenset([*(k for k in raw if not isinstance(raw[k], dict)),
                          *(f"{t}.{k}" for t in ("tls", "data", "policy")
                            if isinstance(raw.get(t), dict) for k in raw[t])])
    return SiteConfig(site_id=site_id, aggregator=aggregator, state_db=state_db,
                      signing_key=signing_key, data=data, policy=policy, tls=tls,
                      server_name=server_name, source=source, explicit=explicit,
                      audit_log=audit_log)


class _Reader:
    """Typed access to one TOML table with error messages that name the file and dotted key."""

    def __init__(self, raw: dict, where: str, base_dir: Path, prefix: str):
        self.raw, self.where, self.base_dir, self.prefix = raw, where, base_dir, prefix

    def _fail(self, key: str, problem: str):
        raise ConfigError(f"{self.where}: key '{self.prefix}{key}' {problem}")

    def _get(self, key, default, required):
        if key not in self.raw:
            if required:
                self._fail(key, "is missing")
            return default
        return self.raw[key]

    _REQUIRED = object()

    def table(self, key: str) -> "_Reader":
        value = self._get(key, None, True)
        if not isinstance(value, dict):
            self._fail(key, f"must be a table ([{self.prefix}{key}])")
        return _Reader(value, self.where, self.base_dir, f"{self.prefix}{key}.")

    def string(self, key: str, default=_REQUIRED):
        value = self._get(key, default, default is self._REQUIRED)
        if value is default and default is not self._REQUIRED:
            return value
        if not isinstance(value, str) or not value.strip():
            self._fail(key, f"must be a non-empty string, got {value!r}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self._get(key, default, False)
        if not isinstance(value, bool):
            self._fail(key, f"must be true or false, got {value!r}")
        return value

    def integer(self, key: str, default=_REQUIRED) -> int:
        value = self._get(key, default, default is self._REQUIRED)
        if isinstance(value, bool) or not isinstance(value, int):
            self._fail(key, f"must be an integer, got {value!r}")
        return value

    def positive_number(self, key: str) -> float:
        value = self._get(key, None, True)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self._fail(key, f"must be a number, got {value!r}")
        if not math.isfinite(value) or value <= 0:
            self._fail(key, f"must be finite and > 0, got {value!r}")
        return float(value)

    def string_list(self, key: str, default=_REQUIRED) -> list[str]:
        value = self._get(key, default, default is self._REQUIRED)
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            self._fail(key, f"must be a list of non-empty strings, got {value!r}")
        return value

    def resolve(self, value: str, key: str, must_exist: bool = False) -> Path:
        p = Path(value).expanduser()
        if not p.is_absolute():
            p = self.base_dir / p
        if must_exist and not p.exists():
            self._fail(key, f"names {str(p)!r}, which does not exist")
        return p

    def path(self, key: str, must_exist: bool = False) -> Path:
        return self.resolve(self.string(key), key, must_exist)
