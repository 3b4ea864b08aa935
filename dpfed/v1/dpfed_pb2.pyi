from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Preprocessing(_message.Message):
    __slots__ = ("x_mean", "y_mean", "normalize_rows", "x_scale")
    X_MEAN_FIELD_NUMBER: _ClassVar[int]
    Y_MEAN_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_ROWS_FIELD_NUMBER: _ClassVar[int]
    X_SCALE_FIELD_NUMBER: _ClassVar[int]
    x_mean: _containers.RepeatedScalarFieldContainer[float]
    y_mean: float
    normalize_rows: bool
    x_scale: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, x_mean: _Optional[_Iterable[float]] = ..., y_mean: _Optional[float] = ..., normalize_rows: _Optional[bool] = ..., x_scale: _Optional[_Iterable[float]] = ...) -> None: ...

class NoiseTerm(_message.Message):
    __slots__ = ("law", "scale", "draws", "grid", "share")
    LAW_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    DRAWS_FIELD_NUMBER: _ClassVar[int]
    GRID_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    law: str
    scale: float
    draws: int
    grid: float
    share: int
    def __init__(self, law: _Optional[str] = ..., scale: _Optional[float] = ..., draws: _Optional[int] = ..., grid: _Optional[float] = ..., share: _Optional[int] = ...) -> None: ...

class NoiseDescription(_message.Message):
    __slots__ = ("xtx", "xty", "yty", "n")
    XTX_FIELD_NUMBER: _ClassVar[int]
    XTY_FIELD_NUMBER: _ClassVar[int]
    YTY_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    xtx: _containers.RepeatedCompositeFieldContainer[NoiseTerm]
    xty: _containers.RepeatedCompositeFieldContainer[NoiseTerm]
    yty: _containers.RepeatedCompositeFieldContainer[NoiseTerm]
    n: _containers.RepeatedCompositeFieldContainer[NoiseTerm]
    def __init__(self, xtx: _Optional[_Iterable[_Union[NoiseTerm, _Mapping]]] = ..., xty: _Optional[_Iterable[_Union[NoiseTerm, _Mapping]]] = ..., yty: _Optional[_Iterable[_Union[NoiseTerm, _Mapping]]] = ..., n: _Optional[_Iterable[_Union[NoiseTerm, _Mapping]]] = ...) -> None: ...

class TargetSpec(_message.Message):
    __slots__ = ("name", "y_mean", "y_scale")
    NAME_FIELD_NUMBER: _ClassVar[int]
    Y_MEAN_FIELD_NUMBER: _ClassVar[int]
    Y_SCALE_FIELD_NUMBER: _ClassVar[int]
    name: str
    y_mean: float
    y_scale: float
    def __init__(self, name: _Optional[str] = ..., y_mean: _Optional[float] = ..., y_scale: _Optional[float] = ...) -> None: ...

class RoundSpec(_message.Message):
    __slots__ = ("round_id", "coordinator_id", "target", "feature_names", "epsilon", "x_bound", "y_bound", "budget_split", "preprocessing", "public_source", "public_statistics", "quorum", "deadline_unix_ms", "sites", "created_unix_ms", "fit_method", "fit_draws", "fit_seed", "neighbouring", "xtx_sensitivity", "consent_deadline_unix_ms", "aggregation", "noise_threshold", "max_site_rows", "colluders", "site_key_ids", "aggregator_key_id", "targets", "mechanism", "delta")
    class SiteKeyIdsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    FEATURE_NAMES_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    X_BOUND_FIELD_NUMBER: _ClassVar[int]
    Y_BOUND_FIELD_NUMBER: _ClassVar[int]
    BUDGET_SPLIT_FIELD_NUMBER: _ClassVar[int]
    PREPROCESSING_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_SOURCE_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_STATISTICS_FIELD_NUMBER: _ClassVar[int]
    QUORUM_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SITES_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    FIT_METHOD_FIELD_NUMBER: _ClassVar[int]
    FIT_DRAWS_FIELD_NUMBER: _ClassVar[int]
    FIT_SEED_FIELD_NUMBER: _ClassVar[int]
    NEIGHBOURING_FIELD_NUMBER: _ClassVar[int]
    XTX_SENSITIVITY_FIELD_NUMBER: _ClassVar[int]
    CONSENT_DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    AGGREGATION_FIELD_NUMBER: _ClassVar[int]
    NOISE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    MAX_SITE_ROWS_FIELD_NUMBER: _ClassVar[int]
    COLLUDERS_FIELD_NUMBER: _ClassVar[int]
    SITE_KEY_IDS_FIELD_NUMBER: _ClassVar[int]
    AGGREGATOR_KEY_ID_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    round_id: str
    coordinator_id: str
    target: str
    feature_names: _containers.RepeatedScalarFieldContainer[str]
    epsilon: float
    x_bound: float
    y_bound: float
    budget_split: _containers.RepeatedScalarFieldContainer[float]
    preprocessing: Preprocessing
    public_source: str
    public_statistics: bytes
    quorum: int
    deadline_unix_ms: int
    sites: _containers.RepeatedScalarFieldContainer[str]
    created_unix_ms: int
    fit_method: str
    fit_draws: int
    fit_seed: int
    neighbouring: str
    xtx_sensitivity: str
    consent_deadline_unix_ms: int
    aggregation: str
    noise_threshold: int
    max_site_rows: int
    colluders: int
    site_key_ids: _containers.ScalarMap[str, str]
    aggregator_key_id: str
    targets: _containers.RepeatedCompositeFieldContainer[TargetSpec]
    mechanism: str
    delta: float
    def __init__(self, round_id: _Optional[str] = ..., coordinator_id: _Optional[str] = ..., target: _Optional[str] = ..., feature_names: _Optional[_Iterable[str]] = ..., epsilon: _Optional[float] = ..., x_bound: _Optional[float] = ..., y_bound: _Optional[float] = ..., budget_split: _Optional[_Iterable[float]] = ..., preprocessing: _Optional[_Union[Preprocessing, _Mapping]] = ..., public_source: _Optional[str] = ..., public_statistics: _Optional[bytes] = ..., quorum: _Optional[int] = ..., deadline_unix_ms: _Optional[int] = ..., sites: _Optional[_Iterable[str]] = ..., created_unix_ms: _Optional[int] = ..., fit_method: _Optional[str] = ..., fit_draws: _Optional[int] = ..., fit_seed: _Optional[int] = ..., neighbouring: _Optional[str] = ..., xtx_sensitivity: _Optional[str] = ..., consent_deadline_unix_ms: _Optional[int] = ..., aggregation: _Optional[str] = ..., noise_threshold: _Optional[int] = ..., max_site_rows: _Optional[int] = ..., colluders: _Optional[int] = ..., site_key_ids: _Optional[_Mapping[str, str]] = ..., aggregator_key_id: _Optional[str] = ..., targets: _Optional[_Iterable[_Union[TargetSpec, _Mapping]]] = ..., mechanism: _Optional[str] = ..., delta: _Optional[float] = ...) -> None: ...

class Contribution(_message.Message):
    __slots__ = ("round_id", "site_id", "statistics", "n", "epsilon_spent", "spec_digest", "timestamp_unix_ms", "nonce", "noise", "masked")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    STATISTICS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    SPEC_DIGEST_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    NOISE_FIELD_NUMBER: _ClassVar[int]
    MASKED_FIELD_NUMBER: _ClassVar[int]
    round_id: str
    site_id: str
    statistics: bytes
    n: int
    epsilon_spent: float
    spec_digest: str
    timestamp_unix_ms: int
    nonce: str
    noise: NoiseDescription
    masked: bytes
    def __init__(self, round_id: _Optional[str] = ..., site_id: _Optional[str] = ..., statistics: _Optional[bytes] = ..., n: _Optional[int] = ..., epsilon_spent: _Optional[float] = ..., spec_digest: _Optional[str] = ..., timestamp_unix_ms: _Optional[int] = ..., nonce: _Optional[str] = ..., noise: _Optional[_Union[NoiseDescription, _Mapping]] = ..., masked: _Optional[bytes] = ...) -> None: ...

class Refusal(_message.Message):
    __slots__ = ("round_id", "site_id", "spec_digest", "reason", "timestamp_unix_ms", "nonce", "epsilon_spent")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_DIGEST_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    round_id: str
    site_id: str
    spec_digest: str
    reason: str
    timestamp_unix_ms: int
    nonce: str
    epsilon_spent: float
    def __init__(self, round_id: _Optional[str] = ..., site_id: _Optional[str] = ..., spec_digest: _Optional[str] = ..., reason: _Optional[str] = ..., timestamp_unix_ms: _Optional[int] = ..., nonce: _Optional[str] = ..., epsilon_spent: _Optional[float] = ...) -> None: ...

class PhaseMessage(_message.Message):
    __slots__ = ("round_id", "site_id", "spec_digest", "phase", "body", "timestamp_unix_ms", "nonce")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_DIGEST_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    round_id: str
    site_id: str
    spec_digest: str
    phase: str
    body: bytes
    timestamp_unix_ms: int
    nonce: str
    def __init__(self, round_id: _Optional[str] = ..., site_id: _Optional[str] = ..., spec_digest: _Optional[str] = ..., phase: _Optional[str] = ..., body: _Optional[bytes] = ..., timestamp_unix_ms: _Optional[int] = ..., nonce: _Optional[str] = ...) -> None: ...

class PhaseNotice(_message.Message):
    __slots__ = ("round_id", "phase", "spec_envelope", "participants", "deadline_unix_ms", "body", "spec_digest")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    SPEC_ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    SPEC_DIGEST_FIELD_NUMBER: _ClassVar[int]
    round_id: str
    phase: str
    spec_envelope: bytes
    participants: _containers.RepeatedScalarFieldContainer[str]
    deadline_unix_ms: int
    body: bytes
    spec_digest: str
    def __init__(self, round_id: _Optional[str] = ..., phase: _Optional[str] = ..., spec_envelope: _Optional[bytes] = ..., participants: _Optional[_Iterable[str]] = ..., deadline_unix_ms: _Optional[int] = ..., body: _Optional[bytes] = ..., spec_digest: _Optional[str] = ...) -> None: ...

class SiteHello(_message.Message):
    __slots__ = ("site_id", "timestamp_unix_ms", "nonce", "software_version", "total_epsilon", "trusted_coordinator_key_ids")
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    SOFTWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_EPSILON_FIELD_NUMBER: _ClassVar[int]
    TRUSTED_COORDINATOR_KEY_IDS_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    timestamp_unix_ms: int
    nonce: str
    software_version: str
    total_epsilon: float
    trusted_coordinator_key_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, site_id: _Optional[str] = ..., timestamp_unix_ms: _Optional[int] = ..., nonce: _Optional[str] = ..., software_version: _Optional[str] = ..., total_epsilon: _Optional[float] = ..., trusted_coordinator_key_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class SignedEnvelope(_message.Message):
    __slots__ = ("payload", "signature", "key_id", "payload_type")
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_TYPE_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    signature: bytes
    key_id: str
    payload_type: str
    def __init__(self, payload: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., key_id: _Optional[str] = ..., payload_type: _Optional[str] = ...) -> None: ...

class ContributeReply(_message.Message):
    __slots__ = ("round_id", "accepted", "duplicate", "message")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    round_id: str
    accepted: bool
    duplicate: bool
    message: str
    def __init__(self, round_id: _Optional[str] = ..., accepted: _Optional[bool] = ..., duplicate: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: str
    def __init__(self, message: _Optional[str] = ...) -> None: ...

class RoundQuery(_message.Message):
    __slots__ = ("round_id",)
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    round_id: str
    def __init__(self, round_id: _Optional[str] = ...) -> None: ...

class SiteContribution(_message.Message):
    __slots__ = ("site_id", "n", "epsilon_spent", "received_unix_ms", "hidden")
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    n: int
    epsilon_spent: float
    received_unix_ms: int
    hidden: str
    def __init__(self, site_id: _Optional[str] = ..., n: _Optional[int] = ..., epsilon_spent: _Optional[float] = ..., received_unix_ms: _Optional[int] = ..., hidden: _Optional[str] = ...) -> None: ...

class SiteRefusalInfo(_message.Message):
    __slots__ = ("site_id", "reason", "hidden", "epsilon_spent")
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_FIELD_NUMBER: _ClassVar[int]
    EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    reason: str
    hidden: str
    epsilon_spent: float
    def __init__(self, site_id: _Optional[str] = ..., reason: _Optional[str] = ..., hidden: _Optional[str] = ..., epsilon_spent: _Optional[float] = ...) -> None: ...

class RoundStatus(_message.Message):
    __slots__ = ("round_id", "state", "contributions", "refusals", "missing_sites", "message", "quorum", "deadline_unix_ms", "round_seconds", "fit_seconds", "spec_digest", "consented", "dropped", "phases", "started_unix_ms", "spec", "invited")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[RoundStatus.State]
        OPEN: _ClassVar[RoundStatus.State]
        FITTING: _ClassVar[RoundStatus.State]
        DONE: _ClassVar[RoundStatus.State]
        FAILED: _ClassVar[RoundStatus.State]
        CONSENT: _ClassVar[RoundStatus.State]
        RELEASE: _ClassVar[RoundStatus.State]
        KEYS: _ClassVar[RoundStatus.State]
        UNMASK: _ClassVar[RoundStatus.State]
    STATE_UNSPECIFIED: RoundStatus.State
    OPEN: RoundStatus.State
    FITTING: RoundStatus.State
    DONE: RoundStatus.State
    FAILED: RoundStatus.State
    CONSENT: RoundStatus.State
    RELEASE: RoundStatus.State
    KEYS: RoundStatus.State
    UNMASK: RoundStatus.State
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTIONS_FIELD_NUMBER: _ClassVar[int]
    REFUSALS_FIELD_NUMBER: _ClassVar[int]
    MISSING_SITES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    QUORUM_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    ROUND_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SPEC_DIGEST_FIELD_NUMBER: _ClassVar[int]
    CONSENTED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    INVITED_FIELD_NUMBER: _ClassVar[int]
    round_id: str
    state: RoundStatus.State
    contributions: _containers.RepeatedCompositeFieldContainer[SiteContribution]
    refusals: _containers.RepeatedCompositeFieldContainer[SiteRefusalInfo]
    missing_sites: _containers.RepeatedScalarFieldContainer[str]
    message: str
    quorum: int
    deadline_unix_ms: int
    round_seconds: float
    fit_seconds: float
    spec_digest: str
    consented: _containers.RepeatedScalarFieldContainer[str]
    dropped: _containers.RepeatedScalarFieldContainer[str]
    phases: _containers.RepeatedCompositeFieldContainer[PhaseTime]
    started_unix_ms: int
    spec: RoundSpec
    invited: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, round_id: _Optional[str] = ..., state: _Optional[_Union[RoundStatus.State, str]] = ..., contributions: _Optional[_Iterable[_Union[SiteContribution, _Mapping]]] = ..., refusals: _Optional[_Iterable[_Union[SiteRefusalInfo, _Mapping]]] = ..., missing_sites: _Optional[_Iterable[str]] = ..., message: _Optional[str] = ..., quorum: _Optional[int] = ..., deadline_unix_ms: _Optional[int] = ..., round_seconds: _Optional[float] = ..., fit_seconds: _Optional[float] = ..., spec_digest: _Optional[str] = ..., consented: _Optional[_Iterable[str]] = ..., dropped: _Optional[_Iterable[str]] = ..., phases: _Optional[_Iterable[_Union[PhaseTime, _Mapping]]] = ..., started_unix_ms: _Optional[int] = ..., spec: _Optional[_Union[RoundSpec, _Mapping]] = ..., invited: _Optional[_Iterable[str]] = ...) -> None: ...

class PhaseTime(_message.Message):
    __slots__ = ("phase", "started_unix_ms", "seconds")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    phase: str
    started_unix_ms: int
    seconds: float
    def __init__(self, phase: _Optional[str] = ..., started_unix_ms: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class RoundSummary(_message.Message):
    __slots__ = ("round_id", "state", "coordinator_id", "target", "epsilon", "invited", "consented", "contributed", "refused", "quorum", "started_unix_ms", "deadline_unix_ms", "message")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    INVITED_FIELD_NUMBER: _ClassVar[int]
    CONSENTED_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    QUORUM_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    round_id: str
    state: RoundStatus.State
    coordinator_id: str
    target: str
    epsilon: float
    invited: int
    consented: int
    contributed: int
    refused: int
    quorum: int
    started_unix_ms: int
    deadline_unix_ms: int
    message: str
    def __init__(self, round_id: _Optional[str] = ..., state: _Optional[_Union[RoundStatus.State, str]] = ..., coordinator_id: _Optional[str] = ..., target: _Optional[str] = ..., epsilon: _Optional[float] = ..., invited: _Optional[int] = ..., consented: _Optional[int] = ..., contributed: _Optional[int] = ..., refused: _Optional[int] = ..., quorum: _Optional[int] = ..., started_unix_ms: _Optional[int] = ..., deadline_unix_ms: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ListRoundsRequest(_message.Message):
    __slots__ = ("limit", "before")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    limit: int
    before: str
    def __init__(self, limit: _Optional[int] = ..., before: _Optional[str] = ...) -> None: ...

class ListRoundsReply(_message.Message):
    __slots__ = ("rounds",)
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    rounds: _containers.RepeatedCompositeFieldContainer[RoundSummary]
    def __init__(self, rounds: _Optional[_Iterable[_Union[RoundSummary, _Mapping]]] = ...) -> None: ...

class RoundResult(_message.Message):
    __slots__ = ("round_id", "summary_json", "beta_draws", "draws", "dim", "targets")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_JSON_FIELD_NUMBER: _ClassVar[int]
    BETA_DRAWS_FIELD_NUMBER: _ClassVar[int]
    DRAWS_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    round_id: str
    summary_json: str
    beta_draws: bytes
    draws: int
    dim: int
    targets: int
    def __init__(self, round_id: _Optional[str] = ..., summary_json: _Optional[str] = ..., beta_draws: _Optional[bytes] = ..., draws: _Optional[int] = ..., dim: _Optional[int] = ..., targets: _Optional[int] = ...) -> None: ...

class ListSitesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SiteInfo(_message.Message):
    __slots__ = ("site_id", "key_id", "connected", "last_seen_unix_ms", "hidden", "spent_epsilon", "declared_total_epsilon", "rounds")
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_FIELD_NUMBER: _ClassVar[int]
    SPENT_EPSILON_FIELD_NUMBER: _ClassVar[int]
    DECLARED_TOTAL_EPSILON_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    key_id: str
    connected: bool
    last_seen_unix_ms: int
    hidden: str
    spent_epsilon: float
    declared_total_epsilon: float
    rounds: int
    def __init__(self, site_id: _Optional[str] = ..., key_id: _Optional[str] = ..., connected: _Optional[bool] = ..., last_seen_unix_ms: _Optional[int] = ..., hidden: _Optional[str] = ..., spent_epsilon: _Optional[float] = ..., declared_total_epsilon: _Optional[float] = ..., rounds: _Optional[int] = ...) -> None: ...

class SiteHistory(_message.Message):
    __slots__ = ("site_id", "spent_epsilon", "rounds", "declared_total_epsilon", "last_unix_ms")
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    SPENT_EPSILON_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    DECLARED_TOTAL_EPSILON_FIELD_NUMBER: _ClassVar[int]
    LAST_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    spent_epsilon: float
    rounds: int
    declared_total_epsilon: float
    last_unix_ms: int
    def __init__(self, site_id: _Optional[str] = ..., spent_epsilon: _Optional[float] = ..., rounds: _Optional[int] = ..., declared_total_epsilon: _Optional[float] = ..., last_unix_ms: _Optional[int] = ...) -> None: ...

class ListSitesReply(_message.Message):
    __slots__ = ("sites",)
    SITES_FIELD_NUMBER: _ClassVar[int]
    sites: _containers.RepeatedCompositeFieldContainer[SiteInfo]
    def __init__(self, sites: _Optional[_Iterable[_Union[SiteInfo, _Mapping]]] = ...) -> None: ...

class SiteQuery(_message.Message):
    __slots__ = ("site_id",)
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    def __init__(self, site_id: _Optional[str] = ...) -> None: ...

class SiteRoundSpend(_message.Message):
    __slots__ = ("round_id", "epsilon", "received_unix_ms", "refused")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    round_id: str
    epsilon: float
    received_unix_ms: int
    refused: bool
    def __init__(self, round_id: _Optional[str] = ..., epsilon: _Optional[float] = ..., received_unix_ms: _Optional[int] = ..., refused: _Optional[bool] = ...) -> None: ...

class SiteSpending(_message.Message):
    __slots__ = ("site_id", "hidden", "spent_epsilon", "declared_total_epsilon", "rounds")
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_FIELD_NUMBER: _ClassVar[int]
    SPENT_EPSILON_FIELD_NUMBER: _ClassVar[int]
    DECLARED_TOTAL_EPSILON_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    hidden: str
    spent_epsilon: float
    declared_total_epsilon: float
    rounds: _containers.RepeatedCompositeFieldContainer[SiteRoundSpend]
    def __init__(self, site_id: _Optional[str] = ..., hidden: _Optional[str] = ..., spent_epsilon: _Optional[float] = ..., declared_total_epsilon: _Optional[float] = ..., rounds: _Optional[_Iterable[_Union[SiteRoundSpend, _Mapping]]] = ...) -> None: ...
