"""Simulated sites of a secure round for dpfed_apps.bench.round (``--aggregation secure``).

The aggregator is the real one (its own process, dpfed_apps/bench/simulated_sites.py); the N sites
live in this process as ``dpfed.secagg`` SiteSessions behind one grpc.aio event loop: each site
holds a real Subscribe stream (signed SiteHello) and answers every pushed notice over real gRPC
(SendPhase advertise / share_keys / confirm / unmask, Contribute with its masked release; a dropout
refuses in the release step).

Timing methodology. Sites compute in parallel on their own machines; one benchmark process
computing 1000 sites' key shares in series (tens of CPU seconds, docs/secure_aggregation.md)
would time this machine, not the federation. So, as dpfed_apps.bench.round pre-signs independent
releases, every site message is computed and signed *before the clock starts*, by running the
whole protocol in memory with the same RoundConfig and dropouts: the aggregator's outputs are
deterministic functions of what it received (it signs them with its identity key, and Ed25519
signatures are deterministic; the in-memory run signs with the same key), so the real
aggregator pushes exactly the bundles, deliveries, survivor lists and unmask requests the
in-memory run produced, and the sites' precomputed answers are the ones they would compute
(each in-memory site verifies the aggregator's signatures, as a SiteNode does). Each pushed
body is compared with the precomputed one (a mismatch fails the benchmark). Reported beside
the measured wall time: per step the slowest site's compute time (measured in the
precomputation), and ``critical_path_s`` = measured round time + the sum over steps of the
slowest site, i.e. the latency of a deployment whose sites compute in parallel.

Dropouts announce themselves with a Refusal in the release step, so the step ends when every
site answered; a silent dropout makes the round wait for the step's deadline instead (a
configuration choice, docs/protocol.md), with the same work for the aggregator.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import time
from dataclasses import dataclass, field

import numpy as np

SUBSCRIBE = "/dpfed.v1.Aggregator/Subscribe"
SEND_PHASE = "/dpfed.v1.Aggregator/SendPhase"
CONTRIBUTE = "/dpfed.v1.Aggregator/Contribute"
REFUSE = "/dpfed.v1.Aggregator/Refuse"
GET_ROUND = "/dpfed.v1.Aggregator/GetRound"
LIST_SITES = "/dpfed.v1.Aggregator/ListSites"
STEP_OF_NOTICE = {"keys": "advertise", "share_keys": "share_keys", "release": "release",
                  "confirm": "confirm", "unmask": "unmask"}


@dataclass
class SecurePlan:
    """Everything the simulated sites send, precomputed and signed (serialised envelopes),
    the bodies the aggregator is expected to push, and the sites' compute times."""

    hellos: dict[str, bytes]
    consents: dict[str, bytes]
    answers: dict[str, dict[str, bytes]]        # site -> notice phase -> envelope bytes
    expected: dict[str, dict[str, bytes]]       # site -> notice phase -> body
    dropouts: list[str]
    site_max_s: dict[str, float] = field(default_factory=dict)
    site_total_s: dict[str, float] = field(default_factory=dict)
    expected_sum: np.ndarray | None = None
    config: object = None


def _release_vector(calibration, spec, d: int, n: int, rng) -> np.ndarray:
    """A release-shaped input: the exact statistics of clipped rows on the grid plus a noise
    share (``release_exact``, as a site of a secure round)."""
    from site_node.release import exact_clipped_statistics
    a = rng.uniform(-1, 1, size=(n, d)) * 0.5
    y = rng.uniform(-1, 1, size=n)
    return calibration.release_exact(exact_clipped_statistics(a, y, spec.x_bound,
                                                              spec.y_bound))


def plan_round(spec, spec_digest: str, site_keys: dict, dropouts: list[str], seed: int = 0,
               *, aggregator_key=None) -> SecurePlan:
    """Run the round in memory (sites and an AggregatorSession, every message through its
    bytes) and sign each site's envelopes; see the module docstring. ``aggregator_key``: the
    real aggregator's identity key (SigningKey, its signing_key), which signs every
    aggregator message here as there."""
    from dpfed.secagg.messages import AGGREGATOR
    from dpfed import secure_round
    from dpfed.noise import to_proto
    from dpfed.secagg.messages import parse
    from dpfed.secagg.protocol import AggregatorSession, SiteSession
    from dpfed.v1 import dpfed_pb2 as pb

    rng = np.random.default_rng(seed)
    sites = sorted(site_keys)
    secure = secure_round.build(spec, sites)
    config, calibration = secure.config, secure.calibration
    public = {s: k.public_key for s, k in site_keys.items()}
    now = int(time.time() * 1000)
    d = len(spec.feature_names)

    def phase_msg(site, phase, body=b""):
        return site_keys[site].sign(pb.PhaseMessage(
            round_id=spec.round_id, site_id=site, spec_digest=spec_digest, phase=phase,
            body=body, timestamp_unix_ms=now, nonce=secrets.token_hex(16))).SerializeToString()

    plan = SecurePlan(
        hellos={s: site_keys[s].sign(pb.SiteHello(site_id=s, timestamp_unix_ms=now,
                                                  nonce=secrets.token_hex(16),
                                                  software_version="bench")).SerializeToString()
                for s in sites},
        consents={s: phase_msg(s, "consent") for s in sites},
        answers={s: {} for s in sites}, expected={s: {} for s in sites},
        dropouts=sorted(dropouts), config=config)
    agg = AggregatorSession(config, public, signing_key=aggregator_key)
    agg_public = None if aggregator_key is None else aggregator_key.public_key
    sessions = {}
    times: dict[str, list[float]] = {k: [] for k in ("keys", "share_keys", "release", "confirm",
                                                     "unmask")}

    def timed(step, fn):
        t0 = time.perf_counter()
        out = fn()
        times[step].append(time.perf_counter() - t0)
        return out

    everyone = secure_round.encode_keys(
        public if agg_public is None else {**public, AGGREGATOR: agg_public})
    for s in sites:
        sessions[s] = SiteSession(config, s, site_keys[s], public, aggregator_key=agg_public)
        plan.expected[s]["keys"] = everyone
        advert = timed("keys", lambda: sessions[s].advertise().to_bytes())
        agg.receive(parse(advert))
        plan.answers[s]["keys"] = phase_msg(s, "advertise", advert)
    bundles = agg.close_advertisements()
    for s in sites:
        body = bundles[s].to_bytes()
        plan.expected[s]["share_keys"] = body
        shares = timed("share_keys", lambda: sessions[s].share_keys(body).to_bytes())
        agg.receive(parse(shares))
        plan.answers[s]["share_keys"] = phase_msg(s, "share_keys", shares)
    deliveries = agg.close_share_keys()
    inputs = {}
    noise = to_proto(secure.share_noise())
    for s in sites:
        body = deliveries[s].to_bytes()
        plan.expected[s]["release"] = body
        if s in plan.dropouts:
            plan.answers[s]["release"] = site_keys[s].sign(pb.Refusal(
                round_id=spec.round_id, site_id=s, spec_digest=spec_digest,
                reason="benchmark dropout after key agreement", timestamp_unix_ms=now,
                nonce=secrets.token_hex(16))).SerializeToString()
            continue
        x = _release_vector(calibration, spec, d, 100, rng)
        inputs[s] = x
        masked = timed("release", lambda: sessions[s].masked_input(body, x).to_bytes())
        agg.receive(parse(masked))
        plan.answers[s]["release"] = site_keys[s].sign(pb.Contribution(
            round_id=spec.round_id, site_id=s, masked=masked, epsilon_spent=spec.epsilon,
            spec_digest=spec_digest, timestamp_unix_ms=now, nonce=secrets.token_hex(16),
            noise=noise)).SerializeToString()
    lists = agg.close_masked_inputs()
    for s in sorted(lists):
        body = lists[s].to_bytes()
        plan.expected[s]["confirm"] = body
        answer = timed("confirm", lambda: sessions[s].confirm(body).to_bytes())
        agg.receive(parse(answer))
        plan.answers[s]["confirm"] = phase_msg(s, "confirm", answer)
    requests = agg.close_consistency()
    for s in sorted(requests):
        body = requests[s].to_bytes()
        plan.expected[s]["unmask"] = body
        answer = timed("unmask", lambda: sessions[s].unmask(body).to_bytes())
        plan.answers[s]["unmask"] = phase_msg(s, "unmask", answer)
    from dpfed.secagg.fixedpoint import wrap_sum
    plan.expected_sum = wrap_sum(list(inputs.values()))
    plan.site_max_s = {k: round(max(v), 4) for k, v in times.items() if v}
    plan.site_total_s = {k: round(sum(v), 3) for k, v in times.items() if v}
    return plan


def _notice(envelope) -> tuple[str, bytes, str]:
    """(phase, body, round id) of a pushed PhaseNotice, read straight from its canonical JSON
    (a ~20 kB payload: cheaper than protobuf's json_format)."""
    obj = json.loads(envelope.payload)
    return obj.get("phase", ""), base64.b64decode(obj.get("body", "")), obj.get("round_id", "")


async def run_sites(address: str, plan: SecurePlan, spec_envelope, *, connections: int,
                    timeout_s: float = 600.0) -> dict:
    """Subscribe every site, start the round (the clock starts), answer every notice with the
    precomputed envelope; returns timings. Raises on any rejection or unexpected body."""
    import grpc

    from dpfed.v1 import dpfed_pb2 as pb

    channels = [grpc.aio.insecure_channel(address, options=[
        ("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", 64 << 20),
        ("grpc.max_send_message_length", 64 << 20)]) for _ in range(connections)]
    sites = sorted(plan.hellos)
    rpc = {}
    for i, ch in enumerate(channels):
        rpc[i] = dict(
            subscribe=ch.unary_stream(SUBSCRIBE, request_serializer=None,
                                      response_deserializer=pb.SignedEnvelope.FromString),
            phase=ch.unary_unary(SEND_PHASE, request_serializer=None,
                                 response_deserializer=pb.Ack.FromString),
            contribute=ch.unary_unary(CONTRIBUTE, request_serializer=None,
                                      response_deserializer=pb.ContributeReply.FromString),
            refuse=ch.unary_unary(REFUSE, request_serializer=None,
                                  response_deserializer=pb.Ack.FromString),
            get_round=ch.unary_unary(GET_ROUND, request_serializer=pb.RoundQuery.SerializeToString,
                                     response_deserializer=pb.RoundStatus.FromString),
            list_sites=ch.unary_unary(LIST_SITES,
                                      request_serializer=pb.ListSitesRequest.SerializeToString,
                                      response_deserializer=pb.ListSitesReply.FromString),
            start=ch.unary_unary("/dpfed.v1.Aggregator/StartRound",
                                 request_serializer=pb.SignedEnvelope.SerializeToString,
                                 response_deserializer=pb.RoundStatus.FromString))
    first_notice: dict[str, float] = {}
    problems: list[str] = []
    done = asyncio.Event()
    t0 = [0.0]

    async def site(i: int, s: str):
        calls = rpc[i % connections]
        phase = ""
        stream = calls["subscribe"](plan.hellos[s])
        try:
            async for env in stream:
                if env.payload_type == "dpfed.v1.RoundSpec":
                    await calls["phase"](plan.consents[s], timeout=timeout_s)
                    continue
                phase, body, _ = _notice(env)
                first_notice.setdefault(phase, time.perf_counter() - t0[0])
                if phase != "keys" and body != plan.expected[s].get(phase):
                    problems.append(f"{s}: the aggregator pushed another {phase} body than "
                                    f"the in-memory run")
                    return
                answer = plan.answers[s][phase]
                if phase == "release":
                    if s in plan.dropouts:
                        await calls["refuse"](answer, timeout=timeout_s)
                        return
                    reply = await calls["contribute"](answer, timeout=timeout_s)
                    assert reply.accepted, reply.message
                else:
                    await calls["phase"](answer, timeout=timeout_s)
                if phase == "unmask":
                    return
        except grpc.aio.AioRpcError as exc:
            if not done.is_set() and exc.code() != grpc.StatusCode.CANCELLED:
                if not (phase == "unmask" and exc.code() == grpc.StatusCode.FAILED_PRECONDITION):
                    problems.append(f"{s}: {exc.code().name}: {exc.details()}")
        finally:
            stream.cancel()

    tasks = [asyncio.create_task(site(i, s)) for i, s in enumerate(sites)]
    # Every stream registered before the clock starts.
    while True:
        listed = await rpc[0]["list_sites"](pb.ListSitesRequest(), timeout=30)
        if sum(1 for x in listed.sites if x.connected) >= len(sites):
            break
        await asyncio.sleep(0.05)
    t0[0] = time.perf_counter()
    await rpc[0]["start"](spec_envelope, timeout=60)
    query = pb.RoundQuery(round_id=spec_envelope_round_id(spec_envelope))
    while True:
        status = await rpc[0]["get_round"](query, timeout=60)
        if status.state in (pb.RoundStatus.DONE, pb.RoundStatus.FAILED) or problems:
            break
        await asyncio.sleep(0.005)
    round_s = time.perf_counter() - t0[0]
    done.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for ch in channels:
        await ch.close()
    if problems:
        raise RuntimeError("; ".join(problems[:5]))
    return {"round_s": round_s, "status": status, "first_notice_s": first_notice}


def spec_envelope_round_id(envelope) -> str:
    return json.loads(envelope.payload)["round_id"]
