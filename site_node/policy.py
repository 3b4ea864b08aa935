"""What a site agrees to release: pure checks of a round spec against the site's policy.

Order matters. The envelope's signature is verified against the trusted coordinator keys
*before anything else*: an unsigned or forged spec is never parsed for meaning, so nothing in
it can steer the site. Then every public parameter of the mechanism (method.md section 2) is
checked. Anything outside the policy raises ``PolicyViolation`` with a reason that is safe to
send back in a signed Refusal; nothing is released and nothing is debited.
"""

from __future__ import annotations

import math
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.canonical import CanonicalError
from dpfed.wire.signing import SignatureError, key_id, load_public_key, verify
from site_node.config import PolicyConfig
from dpfed.sensitivity import NEIGHBOURING, XTX_SENSITIVITIES, validate_privacy_parameters

ROUND_SPEC = "dpfed.v1.RoundSpec"


class PolicyViolation(ValueError):
    """The request is outside the site's policy; ``str(exc)`` is the reason."""


def trusted_keys(paths) -> dict[str, Ed25519PublicKey]:
    """key id -> public key for the coordinator key files in the policy."""
    keys = {}
    for p in paths:
        k = load_public_key(Path(p))
        keys[key_id(k)] = k
    return keys


def verify_spec(envelope: pb.SignedEnvelope, trusted: dict[str, Ed25519PublicKey]) -> pb.RoundSpec:
    """The RoundSpec inside ``envelope`` if a trusted coordinator signed it; else PolicyViolation."""
    try:
        return verify(envelope, trusted, ROUND_SPEC)
    except SignatureError as exc:
        raise PolicyViolation(f"spec not signed by a trusted coordinator: {exc}") from None
    except CanonicalError as exc:
        raise PolicyViolation(f"malformed round spec: {exc}") from None


def round_mechanism(spec: pb.RoundSpec) -> tuple[str, str]:
    """(neighbouring, xtx_sensitivity) of a spec: empty strings mean the defaults
    ("add_remove", "exact"); an unknown value raises PolicyViolation (fail closed)."""
    neighbouring = spec.neighbouring or "add_remove"
    rule = spec.xtx_sensitivity or "exact"
    if neighbouring not in NEIGHBOURING:
        raise PolicyViolation(f"unknown neighbouring relation {spec.neighbouring!r}; this site "
                              f"knows {', '.join(NEIGHBOURING)}")
    if rule not in XTX_SENSITIVITIES:
        raise PolicyViolation(f"unknown xtx_sensitivity {spec.xtx_sensitivity!r}; this site "
                              f"knows {', '.join(XTX_SENSITIVITIES)}")
    return neighbouring, rule


def _allowed(name: str, allowed) -> bool:
    return "*" in allowed or name in allowed


def check_spec(spec: pb.RoundSpec, policy: PolicyConfig, *, site_id: str, spent: float,
               total: float | None, now_ms: int | None = None) -> None:
    """Raise PolicyViolation unless ``spec`` may be answered with budget ``spent`` of ``total``
    (None: no site-wide cap, a per-patient budget only; the per-patient filter is applied to
    the rows, not here: site_node.node)."""
    if not spec.round_id:
        raise PolicyViolation("round spec has no round_id")
    if spec.sites and site_id not in spec.sites:
        raise PolicyViolation(f"site {site_id!r} is not invited to round {spec.round_id}")
    if now_ms is not None and spec.deadline_unix_ms and now_ms > spec.deadline_unix_ms:
        raise PolicyViolation(f"round {spec.round_id} is past its deadline")

    neighbouring, _ = round_mechanism(spec)
    check_aggregation(spec, policy)
    check_mechanism(spec, policy)
    if spec.targets:
        check_targets(spec, policy)
    if neighbouring == "replace_one" and not policy.allow_replace_one:
        raise PolicyViolation("a replace_one round releases n exactly; this site's policy does "
                              "not allow it (policy.allow_replace_one = false)")
    if neighbouring == "replace_one" and policy.patient_epsilon is not None:
        # The filter leaves patients out; an exact n would publish how many.
        raise PolicyViolation("a replace_one round releases n exactly, which would reveal how "
                              "many patients the per-patient budget leaves out; this site "
                              "answers add_remove rounds only")
    try:
        validate_privacy_parameters(spec.epsilon, spec.x_bound, spec.y_bound,
                                    list(spec.budget_split), neighbouring=neighbouring)
    except ValueError as exc:
        raise PolicyViolation(f"invalid privacy parameters: {exc}") from None
    eps = spec.epsilon
    if eps > policy.max_epsilon_per_round:
        raise PolicyViolation(f"epsilon {eps:g} exceeds max_epsilon_per_round "
                              f"{policy.max_epsilon_per_round:g}")
    if total is None and policy.patient_epsilon is None:
        raise PolicyViolation("no privacy budget: the site has neither a total nor a "
                              "per-patient budget")
    if total is not None and spent + eps > total + 1e-9:
        remaining = max(0.0, total - spent)
        raise PolicyViolation(f"privacy budget exhausted: epsilon {eps:g} requested, "
                              f"{remaining:g} of {total:g} remaining")
    if policy.patient_epsilon is not None and eps > policy.patient_epsilon + 1e-9:
        raise PolicyViolation(f"epsilon {eps:g} exceeds the per-patient budget "
                              f"{policy.patient_epsilon:g}")

    features = list(spec.feature_names)
    if not spec.targets:
        if not spec.target:
            raise PolicyViolation("round spec names no target")
        if not _allowed(spec.target, policy.allowed_targets):
            raise PolicyViolation(f"target {spec.target!r} is not in allowed_targets")
    if not features:
        raise PolicyViolation("round spec names no features")
    if len(set(features)) != len(features):
        raise PolicyViolation("round spec repeats a feature")
    if spec.target in features:
        raise PolicyViolation(f"target {spec.target!r} is also a feature")
    not_allowed = [f for f in features if not _allowed(f, policy.allowed_features)]
    if not_allowed:
        raise PolicyViolation(f"feature(s) not in allowed_features: {not_allowed}")

    pre = spec.preprocessing
    if len(pre.x_mean) != len(features):
        raise PolicyViolation(f"preprocessing has {len(pre.x_mean)} feature means for "
                              f"{len(features)} features")
    if not all(math.isfinite(v) for v in pre.x_mean) or not math.isfinite(pre.y_mean):
        raise PolicyViolation("preprocessing means must be finite")
    if len(pre.x_scale) not in (0, len(features)):
        raise PolicyViolation(f"preprocessing has {len(pre.x_scale)} column scales for "
                              f"{len(features)} features")
    if not all(math.isfinite(v) and v > 0 for v in pre.x_scale):
        raise PolicyViolation("preprocessing column scales must be finite and > 0")


#: Noise mechanisms a spec may name ("" is "laplace").
MECHANISMS = ("laplace", "gaussian")


def round_noise(spec: pb.RoundSpec) -> str:
    """The spec's noise mechanism ("" means "laplace"); an unknown one raises PolicyViolation."""
    mechanism = spec.mechanism or "laplace"
    if mechanism not in MECHANISMS:
        raise PolicyViolation(f"unknown noise mechanism {spec.mechanism!r}; this site knows "
                              f"{', '.join(MECHANISMS)}")
    return mechanism


def check_mechanism(spec: pb.RoundSpec, policy: PolicyConfig) -> None:
    """The noise mechanism (issue 23): "laplace" is pure eps (``spec.delta`` must be 0);
    "gaussian" is (eps, delta) with 0 < delta < 1, and is admitted only under a per-patient
    (eps, delta) budget (policy.patient_epsilon with policy.patient_delta): a pure-eps budget
    (per patient, or the site-wide total alone) cannot account a Gaussian release. Outside
    secure aggregation only joint rounds (``spec.targets``) draw Gaussian noise at the site."""
    from dpfed.secure_round import is_secure
    mechanism = round_noise(spec)
    if mechanism == "laplace":
        if spec.delta:
            raise PolicyViolation("a Laplace round is pure eps: it must not name a delta")
        return
    if not (math.isfinite(spec.delta) and 0 < spec.delta < 1):
        raise PolicyViolation("a Gaussian round needs a delta with 0 < delta < 1")
    if policy.patient_epsilon is None or policy.patient_delta is None:
        raise PolicyViolation("a Gaussian round is (eps, delta)-DP; this site's budget is pure "
                              "eps (it needs policy.patient_epsilon and policy.patient_delta), "
                              "so it cannot account the release")
    if spec.delta > policy.patient_delta:
        raise PolicyViolation(f"delta {spec.delta:g} exceeds the per-patient delta "
                              f"{policy.patient_delta:g}")
    if not spec.targets and not is_secure(spec):
        raise PolicyViolation("this site draws Gaussian noise for joint rounds (targets) only")


def check_targets(spec: pb.RoundSpec, policy: PolicyConfig) -> None:
    """A joint round's targets (issue 23): no single ``target`` beside them, add/remove
    neighbours only (every n_j is a private count), each target named once, allowed, not a
    feature, with a finite public centre and a finite scale > 0. Reasons name columns from the
    spec, never a value of the site's data."""
    if spec.target:
        raise PolicyViolation("a joint round names its targets in `targets`, not `target`")
    if (spec.neighbouring or "add_remove") != "add_remove":
        raise PolicyViolation("a joint round is add_remove only: its per-target counts are "
                              "private and released with noise")
    names = [t.name for t in spec.targets]
    if not all(names):
        raise PolicyViolation("a joint round's target has no name")
    if len(set(names)) != len(names):
        raise PolicyViolation("the joint round repeats a target")
    not_allowed = [n for n in names if not _allowed(n, policy.allowed_targets)]
    if not_allowed:
        raise PolicyViolation(f"target(s) not in allowed_targets: {not_allowed[:5]}"
                              + (f" and {len(not_allowed) - 5} more" if len(not_allowed) > 5
                                 else ""))
    both = sorted(set(names) & set(spec.feature_names))
    if both:
        raise PolicyViolation(f"target(s) also features: {both[:5]}")
    for t in spec.targets:
        if not (math.isfinite(t.y_mean) and math.isfinite(t.y_scale) and t.y_scale > 0):
            raise PolicyViolation(f"target {t.name!r}: its public y_mean must be finite and "
                                  f"its y_scale finite and > 0")


def check_aggregation(spec: pb.RoundSpec, policy: PolicyConfig) -> None:
    """The aggregation mode (dpfed.secure_round): "independent", or "secure" with parameters
    this site accepts. Each site adds a 1/T share of one noise draw, and is protected by a
    full draw only if at least T contributors are honest: the larger T, the more this site
    trusts the others, so the policy caps it (``max_noise_threshold``; the default 1 accepts
    only rounds where its own share is a full draw). The policy can also require the round to
    tolerate at least ``min_colluders`` colluding sites (c: a larger c raises the Shamir
    threshold and the floor T + c) and to unmask only sums of at least ``min_contributors``
    contributions (compared with dpfed.secure_round.min_contributors(spec) = max(quorum,
    T + c)). Every reason depends on the spec and the policy only, never on the data."""
    from dpfed.secure_round import (AGGREGATIONS, MAX_SITE_ROWS, aggregation, is_secure,
                                    min_contributors)
    if aggregation(spec) not in AGGREGATIONS:
        raise PolicyViolation(f"unknown aggregation {spec.aggregation!r}; this site knows "
                              f"{', '.join(AGGREGATIONS)}")
    if not is_secure(spec):
        return
    t = spec.noise_threshold
    if t < 1:
        raise PolicyViolation("a secure round needs a noise threshold T >= 1")
    if t > policy.max_noise_threshold:
        raise PolicyViolation(f"noise threshold T = {t} exceeds this site's "
                              f"policy.max_noise_threshold = {policy.max_noise_threshold}: its "
                              f"1/T noise share is a full draw only with at least T honest "
                              f"contributors")
    if spec.colluders < policy.min_colluders:
        raise PolicyViolation(f"the round tolerates c = {spec.colluders} colluding site(s), "
                              f"fewer than this site's policy.min_colluders = "
                              f"{policy.min_colluders}")
    floor = min_contributors(spec)
    if floor < policy.min_contributors:
        raise PolicyViolation(f"the round may unmask a sum of {floor} contribution(s) "
                              f"(max(quorum, T + c)), fewer than this site's "
                              f"policy.min_contributors = {policy.min_contributors}")
    if t > 1 and not spec.site_key_ids:
        # The aggregator relays the other sites' identity keys; unpinned, it could stand in
        # for every other participant and see this site's input with only a 1/T share of
        # noise. With T = 1 the site's own share is a full draw, so nothing is at stake.
        raise PolicyViolation(f"a secure round with T = {t} > 1 must pin the sites' identity "
                              f"keys in the signed spec (site_key_ids): the aggregator could "
                              f"otherwise substitute the other participants")
    if spec.sites and t + spec.colluders > len(spec.sites):
        raise PolicyViolation(f"noise threshold T = {t} plus colluders c = {spec.colluders} "
                              f"exceeds the {len(spec.sites)} invited sites")
    if not 1 <= spec.max_site_rows <= MAX_SITE_ROWS:
        raise PolicyViolation("a secure round needs a public max_site_rows bound")


#: The reason of a min_n refusal under add/remove: fixed text, decided on the *noisy* n.
NOISY_MIN_N_REASON = "the released (noisy) row count is below the policy's min_n"


def check_n(n: int, policy: PolicyConfig) -> None:
    """Small sites are refused: too few records for the noise to leave anything useful, and
    the policy says so. Under replace-one ``n`` is the exact (public by assumption) count;
    under add/remove the site node passes the *noisy* n of the release it already drew
    (site_node.node), so the refusal is post-processing of a DP value."""
    if n < policy.min_n:
        # The reason says only "fewer than min_n"; the exact n stays in the local log.
        raise PolicyViolation(f"fewer usable rows than the policy's min_n = {policy.min_n}")
