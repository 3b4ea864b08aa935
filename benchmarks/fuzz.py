"""Fuzz the aggregator's gRPC surface: random and mutated inputs to every RPC of a real server.

Each input is one of: a valid signed message with one canonical-JSON field replaced, deleted
or added and then *re-signed with the right key* (so it gets past the signature and exercises
the parser, the wire limits and the round logic); a valid envelope with its signature, key id,
payload type or payload bytes damaged; or raw random bytes in place of the protobuf request.
The oracle (``check_outcome``): every call ends with a status that is an *answer*
(INVALID_ARGUMENT, UNAUTHENTICATED, ...), never UNKNOWN (an exception escaped a servicer);
the round holds exactly the contributions the fuzzer was told were accepted, and its sum is
their exact sum; the health service still says SERVING.

    python benchmarks/fuzz.py --inputs 20000 [--seed 1] [--json]

tests/test_fuzz_grpc.py runs the same engine with a small budget.
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import random
import secrets
import struct
import sys
import time
from pathlib import Path

import grpc

from dpfed.v1 import dpfed_pb2 as pb

# Codes that are answers to a judged request. UNKNOWN means an exception escaped a servicer.
ANSWERS = {"OK", "INVALID_ARGUMENT", "UNAUTHENTICATED", "PERMISSION_DENIED",
           "FAILED_PRECONDITION", "ALREADY_EXISTS", "NOT_FOUND"}
# Raw bytes that are not a protobuf message: the servicer answers INVALID_ARGUMENT ("the
# request is not a valid ... message", aggregator.service._parsing), like any other bad input.
RAW_ANSWERS = ANSWERS
# A valid SiteHello opens a stream that stays open: the fuzzer's short deadline ends it.
STREAM_ANSWERS = ANSWERS | {"DEADLINE_EXCEEDED"}

RPCS = ("StartRound", "Subscribe", "Contribute", "Refuse", "GetRound", "GetResult", "ListSites")


def _weird_values(rng: random.Random):
    """Values to put in a JSON field: wrong types, extremes, long and hostile strings."""
    big = rng.choice([300, 5000, 200_000])
    return rng.choice([
        "", " ", "x" * big, "\x00\x01\n\r", "é" * 50, "😀" * 40, "../../etc/passwd",
        "'; DROP TABLE rounds; --", "%s%n%x", "a" * 129, "A" * 32, "0" * 32, "g" * 32,
        "-1", "0", "1", "18446744073709551615", "18446744073709551616", "-9223372036854775809",
        "1e9", "NaN", "Infinity", "-Infinity", "1.5",
        -1, 0, 1, 2**53, 2**64, -2**63, 1e308, -1e308, 5e-324, 0.5, 2.0, 1000.0,
        True, False, None, [], [1, 2], ["a"] * rng.choice([1, 600, 20_000]), {}, {"a": 1},
        base64.b64encode(secrets.token_bytes(rng.choice([0, 1, 18, 100, 5000]))).decode(),
    ])


def _hostile_statistics(rng: random.Random, d: int) -> str:
    """Statistics encodings that are wrong in one way each (header, length, values)."""
    body_len = d * (d + 1) // 2 + d + 1
    kind = rng.randrange(6)
    if kind == 0:    # right length, NaN / inf inside
        vals = [rng.choice([float("nan"), float("inf"), -float("inf"), 1.0])
                for _ in range(body_len)]
        raw = struct.pack("<4sHIQ", b"DPST", 1, d, 50) + struct.pack(f"<{body_len}d", *vals)
    elif kind == 1:  # header claims a huge dimension
        raw = struct.pack("<4sHIQ", b"DPST", 1, rng.choice([2**31, 100_000, 513]), 50)
    elif kind == 2:  # wrong dimension, otherwise well formed
        d2 = rng.choice([1, d + 1, 64])
        n2 = d2 * (d2 + 1) // 2 + d2 + 1
        raw = struct.pack("<4sHIQ", b"DPST", 1, d2, 50) + bytes(8 * n2)
    elif kind == 3:  # truncated
        raw = struct.pack("<4sHIQ", b"DPST", 1, d, 50) + bytes(8 * (body_len - 1))
    elif kind == 4:  # n = 0 or enormous
        raw = struct.pack("<4sHIQ", b"DPST", 1, d, rng.choice([0, 2**64 - 1])) + bytes(8 * body_len)
    else:            # random bytes
        raw = secrets.token_bytes(rng.choice([0, 5, 18, 64]))
    return base64.b64encode(raw).decode()


def mutate_payload(payload: bytes, rng: random.Random, *, dim: int = 3) -> bytes:
    """One field of a canonical JSON payload replaced, removed or added (or the bytes hit)."""
    obj = json.loads(payload)
    op = rng.randrange(10)
    keys = sorted(obj)
    if op <= 4 and keys:
        key = rng.choice(keys)
        obj[key] = (_hostile_statistics(rng, dim) if key in ("statistics", "public_statistics")
                    and rng.random() < 0.6 else _weird_values(rng))
    elif op == 5 and keys:
        del obj[rng.choice(keys)]
    elif op == 6:
        obj[rng.choice(["extra", "n", "round_id", "unknown_field", "epsilon"])] = \
            _weird_values(rng)
    elif op == 7:
        data = bytearray(payload)
        for _ in range(rng.randint(1, 8)):
            if data:
                data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    elif op == 8:
        return payload[:rng.randrange(len(payload) + 1)]
    else:            # a canonical-looking object with a non-canonical spelling
        return json.dumps(obj, sort_keys=False, indent=rng.choice([None, 1])).encode()
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str).encode("utf-8", "surrogatepass")


def resign(key, type_name: str, payload: bytes) -> pb.SignedEnvelope:
    """Sign arbitrary payload bytes as ``type_name`` the way dpfed.wire.signing does."""
    from dpfed.wire.signing import _signed_bytes
    return pb.SignedEnvelope(payload=payload, signature=key.private_key.sign(
        _signed_bytes(type_name, payload)), key_id=key.key_id, payload_type=type_name)


def damage_envelope(env: pb.SignedEnvelope, rng: random.Random) -> pb.SignedEnvelope:
    env = pb.SignedEnvelope.FromString(env.SerializeToString())
    op = rng.randrange(6)
    if op == 0:
        env.signature = secrets.token_bytes(rng.choice([0, 63, 64, 65, 5000]))
    elif op == 1:
        env.key_id = rng.choice(["", "zz", "0" * 32, "a" * 5000, env.key_id.upper()])
    elif op == 2:
        env.payload_type = rng.choice(["", "dpfed.v1.RoundSpec", "dpfed.v1.Contribution",
                                       "dpfed.v1.Refusal", "dpfed.v1.SiteHello", "x" * 5000,
                                       "dpfed.v1.SignedEnvelope"])
    elif op == 3:
        env.payload = secrets.token_bytes(rng.choice([0, 10, 1000]))
    elif op == 4:
        env.payload = env.payload + b" " * rng.choice([1, 5 * 1024 * 1024])
    else:
        env.Clear()
    return env


class AggregatorFuzzer:
    """Drives one real aggregator at ``address``. ``site_keys`` are registered site keys
    (used to re-sign mutated payloads), ``coordinator_key`` the registered coordinator's.
    Needs an OPEN round ``round_id`` of dimension ``dim`` (for contributions) and a second one
    ``refusal_round_id`` (for refusals, so an accepted refusal cannot end the first)."""

    def __init__(self, address: str, *, site_keys: dict, coordinator_key, coordinator_id: str,
                 round_id: str, refusal_round_id: str, spec_digests: dict, dim: int,
                 contributing_sites: list[str], refusing_site: str, seed: int = 0,
                 stats_factory=None):
        self.address = address
        self.site_keys = site_keys
        self.coordinator_key = coordinator_key
        self.coordinator_id = coordinator_id
        self.round_id, self.refusal_round_id = round_id, refusal_round_id
        self.spec_digests = spec_digests
        self.dim = dim
        self.contributing_sites = contributing_sites
        self.refusing_site = refusing_site
        self.rng = random.Random(seed)
        self.stats_factory = stats_factory
        self.channel = grpc.insecure_channel(address, options=[
            ("grpc.max_send_message_length", 32 * 1024 * 1024)])
        from dpfed.v1 import dpfed_pb2_grpc as pb_grpc
        self.stub = pb_grpc.AggregatorStub(self.channel)
        self.codes: dict[str, collections.Counter] = {r: collections.Counter() for r in RPCS}
        self.unexpected: list[tuple[str, str, str]] = []
        self.accepted_contributions: dict[str, pb.SignedEnvelope] = {}
        self.started_rounds: list[str] = []
        self.tried = 0

    def close(self) -> None:
        self.channel.close()

    # -- templates of valid messages --
    def _now(self) -> int:
        return int(time.time() * 1000)

    def _contribution(self, site: str) -> bytes:
        from dpfed.wire.canonical import canonical_bytes
        from dpfed.noise import to_proto
        from dpfed.sensitivity import expected_noise
        stats = self.stats_factory(self.rng.randrange(10**6))
        return canonical_bytes(pb.Contribution(
            round_id=self.round_id, site_id=site, statistics=stats.to_bytes(), n=stats.n,
            epsilon_spent=2.0, spec_digest=self.spec_digests[self.round_id],
            timestamp_unix_ms=self._now(), nonce=secrets.token_hex(16),
            noise=to_proto(expected_noise(self.dim, 1.0, 0.5, 1.0, (0.35, 0.6, 0.03, 0.02)))))

    def _refusal(self, site: str) -> bytes:
        from dpfed.wire.canonical import canonical_bytes
        return canonical_bytes(pb.Refusal(
            round_id=self.refusal_round_id, site_id=site, reason="policy",
            spec_digest=self.spec_digests[self.refusal_round_id], timestamp_unix_ms=self._now(),
            nonce=secrets.token_hex(16)))

    def _hello(self, site: str) -> bytes:
        from dpfed.wire.canonical import canonical_bytes
        return canonical_bytes(pb.SiteHello(site_id=site, timestamp_unix_ms=self._now(),
                                            nonce=secrets.token_hex(16), software_version="f"))

    def _spec(self) -> bytes:
        from dpfed.wire.canonical import canonical_bytes
        now = self._now()
        d = self.dim
        return canonical_bytes(pb.RoundSpec(
            round_id=f"fz-{secrets.token_hex(4)}", coordinator_id=self.coordinator_id,
            target="y", feature_names=[f"x{i}" for i in range(d)], epsilon=1.0, x_bound=0.5,
            y_bound=1.0, budget_split=[0.35, 0.6, 0.03, 0.02], quorum=1,
            deadline_unix_ms=now + 600_000, created_unix_ms=now, fit_method="laplace",
            preprocessing=pb.Preprocessing(x_mean=[0.0] * d)))

    # -- one input --
    def _signed_input(self, type_name: str, payload: bytes, key) -> pb.SignedEnvelope:
        r = self.rng.random()
        if r < 0.03:  # now and then a valid one: the acceptance and duplicate paths run too
            return resign(key, type_name, payload)
        if r < 0.75:
            return resign(key, type_name, mutate_payload(payload, self.rng, dim=self.dim))
        env = resign(key, type_name, payload)
        return damage_envelope(env, self.rng)

    def _raw_call(self, rpc: str, data: bytes) -> str:
        method = f"/dpfed.v1.Aggregator/{rpc}"
        try:
            if rpc == "Subscribe":
                call = self.channel.unary_stream(method)(data, timeout=0.3)
                for _ in call:
                    break
                call.cancel()
            else:
                self.channel.unary_unary(method)(data, timeout=5)
            return "OK"
        except grpc.RpcError as exc:
            return exc.code().name

    def one(self) -> None:
        rng = self.rng
        rpc = rng.choice(RPCS)
        self.tried += 1
        if rng.random() < 0.1 and rpc != "ListSites":
            data = secrets.token_bytes(rng.choice([1, 7, 100, 4096]))
            code = self._raw_call(rpc, data)
            self._record(rpc, code, RAW_ANSWERS if rpc != "Subscribe" else
                         RAW_ANSWERS | STREAM_ANSWERS, "raw bytes")
            return
        allowed = ANSWERS
        try:
            if rpc == "StartRound":
                env = self._signed_input("dpfed.v1.RoundSpec", self._spec(), self.coordinator_key)
                status = self.stub.StartRound(env, timeout=5)
                self.started_rounds.append(status.round_id)
            elif rpc == "Contribute":
                site = rng.choice(self.contributing_sites)
                env = self._signed_input("dpfed.v1.Contribution", self._contribution(site),
                                         self.site_keys[site])
                reply = self.stub.Contribute(env, timeout=5)
                if reply.accepted and not reply.duplicate:
                    from dpfed.wire.canonical import parse_canonical
                    c = parse_canonical(env.payload, "dpfed.v1.Contribution")
                    self.accepted_contributions[c.site_id] = env
            elif rpc == "Refuse":
                env = self._signed_input("dpfed.v1.Refusal", self._refusal(self.refusing_site),
                                         self.site_keys[self.refusing_site])
                self.stub.Refuse(env, timeout=5)
            elif rpc == "Subscribe":
                allowed = STREAM_ANSWERS
                site = rng.choice(sorted(self.site_keys))
                env = self._signed_input("dpfed.v1.SiteHello", self._hello(site),
                                         self.site_keys[site])
                call = self.stub.Subscribe(env, timeout=0.3)
                for _ in call:
                    break
                call.cancel()
            elif rpc in ("GetRound", "GetResult"):
                rid = rng.choice([self.round_id, "", "nope", "x" * rng.choice([129, 10_000]),
                                  "\x00", "r1\n", str(_weird_values(rng))])
                getattr(self.stub, rpc)(pb.RoundQuery(round_id=rid), timeout=5)
            else:
                self.stub.ListSites(pb.ListSitesRequest(), timeout=5)
            self._record(rpc, "OK", allowed, "")
        except grpc.RpcError as exc:
            name = exc.code().name
            if name == "CANCELLED" and rpc == "Subscribe":
                name = "DEADLINE_EXCEEDED"  # our own cancel after the first streamed item
            self._record(rpc, name, allowed, exc.details() or "")

    def _record(self, rpc: str, code: str, allowed: set, detail: str) -> None:
        self.codes[rpc][code] += 1
        if code not in allowed:
            self.unexpected.append((rpc, code, detail[:300]))

    def run(self, n_inputs: int) -> None:
        for _ in range(n_inputs):
            self.one()

    def report(self) -> dict:
        return {"inputs": self.tried,
                "by_rpc": {r: dict(c) for r, c in self.codes.items()},
                "unexpected": self.unexpected[:20],
                "unexpected_count": len(self.unexpected),
                "accepted_contributions": sorted(self.accepted_contributions),
                "rounds_started": len(self.started_rounds)}


def health_status(address: str) -> str:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    with grpc.insecure_channel(address) as ch:
        reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""),
                                                     timeout=5)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def check_outcome(fuzzer: AggregatorFuzzer, manager, baseline: dict) -> list[str]:
    """Everything the fuzz run broke, as sentences (empty: nothing). ``baseline`` maps the
    site ids that contributed before the fuzz to their Statistics."""
    from aggregator.aggregate import exact_sum
    from dpfed.statistics import Statistics
    from dpfed.wire.canonical import parse_canonical
    problems = [f"{rpc} -> {code}: {detail}" for rpc, code, detail in fuzzer.unexpected]
    status = manager.status(fuzzer.round_id)
    expected = dict(baseline)
    for site, env in fuzzer.accepted_contributions.items():
        c = parse_canonical(env.payload, "dpfed.v1.Contribution")
        expected[site] = Statistics.from_bytes(c.statistics)
    held = sorted(c.site_id for c in status.contributions)
    if held != sorted(expected):
        problems.append(f"round holds contributions of {held}, accepted were {sorted(expected)}")
    elif manager.aggregated_statistics(fuzzer.round_id) != exact_sum(list(
            expected[s] for s in sorted(expected))):
        problems.append("the round's sum is not the exact sum of the accepted contributions")
    health = health_status(fuzzer.address)
    if health != "SERVING":
        problems.append(f"health check says {health}")
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                epilog="example: python benchmarks/fuzz.py --inputs 20000 --json")
    p.add_argument("--inputs", type=int, default=5000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    import logging
    import tempfile
    logging.disable(logging.WARNING)  # every rejection logs a warning; thousands of them
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.conftest import Federation, random_statistics
    with tempfile.TemporaryDirectory() as tmp:
        fed = Federation(Path(tmp), max_clock_skew_s=300)
        try:
            fuzzer, baseline = prepare(fed, seed=args.seed)
            t0 = time.perf_counter()
            fuzzer.run(args.inputs)
            elapsed = time.perf_counter() - t0
            problems = check_outcome(fuzzer, fed.manager, baseline)
            out = {**fuzzer.report(), "seconds": round(elapsed, 1), "problems": problems}
            fuzzer.close()
        finally:
            fed.stop()
    if args.json:
        print(json.dumps(out))
    else:
        print(f"fuzzed the aggregator with {out['inputs']} inputs in {out['seconds']} s; "
              f"{len(problems)} problem(s)")
        for rpc, codes in out["by_rpc"].items():
            print(f"  {rpc:<11} {dict(sorted(codes.items()))}")
        for pr in problems[:20]:
            print("  PROBLEM:", pr)
    return 1 if problems else 0


def prepare(fed, *, seed: int = 0, dim: int = 3):
    """Open the two rounds the fuzzer needs on a tests.conftest.Federation; site-a contributes
    to the first before fuzzing. Returns (fuzzer, baseline statistics by site)."""
    from tests.conftest import random_statistics
    fed.start_round(fed.spec("r1", d=dim, quorum=3, deadline_s=3600))
    fed.start_round(fed.spec("r2", d=dim, quorum=1, deadline_s=3600))
    base = random_statistics(d=dim, seed=99)
    fed.stub.Contribute(fed.contribution("site-a", "r1", base), timeout=5)
    fuzzer = AggregatorFuzzer(
        fed.address, site_keys=fed.site_keys, coordinator_key=fed.coordinator_key,
        coordinator_id="coord", round_id="r1", refusal_round_id="r2",
        spec_digests={"r1": fed.spec_digest("r1"), "r2": fed.spec_digest("r2")}, dim=dim,
        contributing_sites=["site-a", "site-b"], refusing_site="site-c", seed=seed,
        stats_factory=lambda s: random_statistics(d=dim, seed=s))
    return fuzzer, {"site-a": base}


if __name__ == "__main__":
    raise SystemExit(main())
