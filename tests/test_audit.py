"""The audit log (issue 22, "An audit log the site keeps"): dpfed.audit's chain and its
verification, the site's log written at the wire, `dpfed site audit`.

Every tampering test edits the SQLite file the way someone with the file would (dropping the
append-only triggers first) and checks that verification names the entry and the kind of
change; each would pass if verification checked less (see the comments)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import sqlite3
import threading
import time

import pytest

from dpfed import audit, exitcodes
from dpfed.audit import RECEIVED, SENT, AuditError, AuditLog, Record
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.canonical import digest, parse_canonical
from dpfed.wire.signing import SigningKey
from site_node.client import Backoff, SiteClient
from site_node.config import load_config
from site_node.ledger import PrivacyLedger
from site_node.node import SiteNode
from tests.test_site_node import FakeAggregator, make_spec, start_fake, write_site


# -- the chain ------------------------------------------------------------------------------

def _records(n):
    return [Record(RECEIVED if i % 2 else SENT, "phase", round_id=f"r{i}", phase="consent",
                   peer="aggregator", message_digest=f"{i:064x}", outcome="consent")
            for i in range(n)]


@pytest.fixture
def log(tmp_path):
    key = SigningKey.generate()
    path = tmp_path / "party.audit.sqlite"
    with AuditLog(path, party="hospital-a", signing_key=key) as w:
        for r in _records(6):
            w.append(r)
    return path, key


def _check(path, key, anchor=None):
    return audit.verify(audit.read(path), {key.key_id: key.public_key}, anchor=anchor)


def _tamper(path, *statements):
    conn = sqlite3.connect(path)
    for t in ("entries_no_update", "entries_no_delete", "heads_no_update", "heads_no_delete"):
        conn.execute(f"DROP TRIGGER {t}")
    for sql, args in statements:
        conn.execute(sql, args)
    conn.commit()
    conn.close()


def _entry(path, seq) -> dict:
    conn = sqlite3.connect(path)
    data = conn.execute("SELECT entry FROM entries WHERE seq = ?", (seq,)).fetchone()[0]
    conn.close()
    return json.loads(data)


def test_an_intact_log_verifies(log):
    path, key = log
    verdict = _check(path, key)
    # The genesis entry (0, "opened") and six appends, each with its own signed head.
    assert verdict.ok and verdict.entries == 7 and verdict.head_seq == 6
    assert verdict.key_id == key.key_id
    contents = audit.read(path)
    assert [h.seq for h in contents.heads] == list(range(7))
    first = audit.entries(contents)[0]
    assert first["kind"] == "opened" and first["prev"] == audit.GENESIS
    assert set(first) == set(audit.FIELDS)


def test_the_writer_refuses_updates_and_deletes(log):
    path, _ = log
    conn = sqlite3.connect(path)
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("UPDATE entries SET hash = 'x' WHERE seq = 1")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("DELETE FROM heads WHERE seq = 6")
    conn.close()


def test_an_edited_entry_is_named(log):
    path, key = log
    edited = _entry(path, 3)
    edited["outcome"] = "refusal"
    data = json.dumps(edited, sort_keys=True, separators=(",", ":")).encode()
    _tamper(path, ("UPDATE entries SET entry = ? WHERE seq = 3", (data,)))
    verdict = _check(path, key)
    assert not verdict.ok
    assert (verdict.problem.seq, verdict.problem.kind) == (3, "edited")
    assert "refusal" not in verdict.problem.message and "consent" not in verdict.problem.message


def test_an_edit_with_every_hash_recomputed_is_caught_by_the_signed_heads(log):
    """The editor recomputes the edited entry's hash and every link after it (no key needed):
    only the heads' signatures catch it (a verifier that only walked the chain would pass)."""
    path, key = log
    rows = [(s, json.loads(e), h) for s, e, h in
            sqlite3.connect(path).execute("SELECT seq, entry, hash FROM entries ORDER BY seq")]
    prev, updates = rows[1][2], []
    for seq, entry, _ in rows[2:]:
        if seq == 2:
            entry["epsilon"] = 9.0
        entry["prev"] = prev
        data = json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()
        prev = audit.chain_hash(prev, data)
        updates.append(("UPDATE entries SET entry = ?, hash = ? WHERE seq = ?", (data, prev, seq)))
    _tamper(path, *updates)
    verdict = _check(path, key)
    assert not verdict.ok and verdict.problem.kind == "edited" and verdict.problem.seq == 2
    assert "signed head at entry 2" in verdict.problem.message


def test_an_edit_with_its_own_hash_recomputed_breaks_the_next_link(log):
    path, key = log
    edited = _entry(path, 4)
    edited["reason"] = "made up"
    data = json.dumps(edited, sort_keys=True, separators=(",", ":")).encode()
    _tamper(path, ("UPDATE entries SET entry = ?, hash = ? WHERE seq = 4",
                   (data, audit.chain_hash(edited["prev"], data))))
    verdict = _check(path, key)
    assert (verdict.problem.seq, verdict.problem.kind) == (4, "edited")


def test_a_deleted_entry_is_named(log):
    path, key = log
    _tamper(path, ("DELETE FROM entries WHERE seq = 2", ()))
    verdict = _check(path, key)
    assert (verdict.problem.seq, verdict.problem.kind) == (2, "deleted")
    assert "entry 2 is missing" in verdict.problem.message


def test_a_deleted_entry_with_the_rest_renumbered_is_named(log):
    path, key = log
    _tamper(path, ("DELETE FROM entries WHERE seq = 2", ()),
            *[("UPDATE entries SET seq = ? WHERE seq = ?", (s - 1, s)) for s in range(3, 7)])
    verdict = _check(path, key)
    assert (verdict.problem.seq, verdict.problem.kind) == (2, "deleted")


def test_swapped_entries_are_reordered(log):
    path, key = log
    conn = sqlite3.connect(path)
    rows = dict((s, (e, h)) for s, e, h in conn.execute("SELECT seq, entry, hash FROM entries"))
    conn.close()
    _tamper(path, ("UPDATE entries SET entry = ?, hash = ? WHERE seq = 2", rows[4]),
            ("UPDATE entries SET entry = ?, hash = ? WHERE seq = 4", rows[2]))
    verdict = _check(path, key)
    assert (verdict.problem.seq, verdict.problem.kind) == (2, "reordered")
    assert "entry 4 is in its place" in verdict.problem.message


def test_a_forged_head_signature_fails(log):
    path, key = log
    forged = SigningKey.generate().sign_detached(audit.HEAD_TYPE, b"anything")
    _tamper(path, ("UPDATE heads SET signature = ? WHERE seq = 5", (forged,)))
    verdict = _check(path, key)
    assert (verdict.problem.seq, verdict.problem.kind) == (5, "bad_signature")


def test_a_head_signed_by_another_key_fails(log):
    """Rewriting the whole log and re-signing every head needs the party's key: a new log
    signed by another key does not verify against the party's."""
    path, key = log
    verdict = audit.verify(audit.read(path), {(other := SigningKey.generate()).key_id:
                                              other.public_key})
    assert verdict.problem.kind == "bad_signature" and "not a key of" in verdict.problem.message


def test_an_entry_appended_without_the_key_is_unsigned(log):
    path, key = log
    last = _entry(path, 6)
    conn = sqlite3.connect(path)
    prev = conn.execute("SELECT hash FROM entries WHERE seq = 6").fetchone()[0]
    conn.close()
    data = audit.entry_bytes(7, last["time_ms"], Record(SENT, "contribution", round_id="x"), prev)
    _tamper(path, ("INSERT INTO entries(seq, entry, hash) VALUES(7, ?, ?)",
                   (data, audit.chain_hash(prev, data))))
    verdict = _check(path, key)
    assert (verdict.problem.seq, verdict.problem.kind) == (7, "unsigned")


def test_truncating_the_tail_is_caught_only_with_an_anchor(log):
    """Deleting the last entries with their heads leaves a valid shorter chain: the log alone
    cannot tell (documented in docs/audit.md); the head kept outside it can."""
    path, key = log
    anchor = audit.read(path).heads[-1]
    _tamper(path, ("DELETE FROM entries WHERE seq >= 5", ()),
            ("DELETE FROM heads WHERE seq >= 5", ()))
    assert _check(path, key).ok                          # undetectable from the log alone
    verdict = _check(path, key, anchor=anchor)
    assert (verdict.problem.seq, verdict.problem.kind) == (5, "deleted")
    assert "ends at entry 4" in verdict.problem.message


def test_deleting_entries_but_not_their_heads_is_caught(log):
    path, key = log
    _tamper(path, ("DELETE FROM entries WHERE seq >= 5", ()))
    verdict = _check(path, key)
    assert (verdict.problem.seq, verdict.problem.kind) == (5, "deleted")


def test_a_batch_is_one_transaction_with_one_head(tmp_path):
    key = SigningKey.generate()
    with AuditLog(tmp_path / "agg.audit.sqlite", party="aggregator", signing_key=key) as w:
        head = w.append_many(_records(100))
        w.append_many(_records(3))
    contents = audit.read(tmp_path / "agg.audit.sqlite")
    assert head.seq == 100 and [h.seq for h in contents.heads] == [0, 100, 103]
    assert audit.verify(contents, {key.key_id: key.public_key}).ok


def test_a_log_belongs_to_one_party(log):
    path, key = log
    with pytest.raises(AuditError, match="audit log of 'hospital-a'"):
        AuditLog(path, party="hospital-b", signing_key=key)


def test_two_writers_on_one_file_never_fork_the_chain(tmp_path):
    key = SigningKey.generate()
    path = tmp_path / "a.sqlite"
    writers = [AuditLog(path, party="p", signing_key=key) for _ in range(2)]
    threads = [threading.Thread(target=lambda w=w: [w.append(r) for r in _records(30)])
               for w in writers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _check(path, key).ok and len(audit.read(path).rows) == 61


def test_a_head_signature_is_never_an_envelope_signature():
    from dpfed.wire.signing import SignatureError, verify
    key = SigningKey.generate()
    spec = pb.RoundSpec(round_id="r")
    envelope = key.sign(spec)
    forged = pb.SignedEnvelope(payload=envelope.payload, key_id=key.key_id,
                               payload_type="dpfed.v1.RoundSpec",
                               signature=key.sign_detached(audit.HEAD_TYPE, envelope.payload))
    with pytest.raises(SignatureError):
        verify(forged, {key.key_id: key.public_key}, "dpfed.v1.RoundSpec")


# -- the site's log ------------------------------------------------------------------------

SENTINEL_VALUE = "7319.4242"


def _sentinel_data(n=200):
    """Rows whose ids and one feature hold sentinels (tests/test_fail_closed.py's pattern)."""
    import numpy as np
    rng = np.random.default_rng(1)
    rows = ["id,g1,g2,g3,drug"]
    for i in range(n):
        x = rng.normal(size=3)
        g1 = SENTINEL_VALUE if i == 7 else f"{x[0]:.4f}"
        rows.append(f"SENTINEL7319-{i},{g1},{x[1]:.4f},{x[2]:.4f},{x.sum():.4f}")
    return "\n".join(rows) + "\n"


def _run_site(node, servicer, until, timeout=20):
    client = SiteClient(node, rpc_timeout_s=5, retry_base_s=0.05, retry_cap_s=0.2,
                        reconnect=Backoff(0.05, 0.2))
    errors = []

    def run():
        try:
            client.run()
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            errors.append(exc)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.time() + timeout
    while not until() and time.time() < deadline and thread.is_alive():
        time.sleep(0.05)
    client.stop()
    thread.join(10)
    assert not thread.is_alive()
    return errors


class RecordingAggregator(FakeAggregator):
    """FakeAggregator keeping the bytes of every consent it received."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.raw = []

    def SendPhase(self, request, context):
        self.raw.append(request.SerializeToString())
        return super().SendPhase(request, context)


@pytest.fixture
def served(tmp_path):
    """A site that answered one round from FakeAggregator over gRPC: consent, release."""
    servicer = RecordingAggregator(None, fail_first_contribute=False)
    server, port = start_fake(servicer)
    try:
        config_path, coordinator, site_key = write_site(
            tmp_path, aggregator=f"127.0.0.1:{port}", data_text=_sentinel_data())
        servicer.spec_envelope = coordinator.sign(make_spec("audited-round"))
        node = SiteNode(load_config(config_path))
        errors = _run_site(node, servicer, lambda: bool(servicer.contributions) and
                           node.ledger.get_release("audited-round").acknowledged)
        assert not errors
    finally:
        server.stop(0)
    return node, servicer, config_path, site_key


def _site_entries(node):
    return audit.entries(audit.read(node.config.audit_path))


def test_the_site_logs_every_request_and_answer_with_the_wire_digests(served):
    node, servicer, _, site_key = served
    entries = _site_entries(node)
    wire = [(e["direction"], e["kind"], e["phase"], e["outcome"]) for e in entries[1:5]]
    assert wire == [(RECEIVED, "spec", "consent", ""), (SENT, "phase", "consent", "consent"),
                    (RECEIVED, "notice", "release", ""), (SENT, "contribution", "release",
                                                          "release")]
    spec_in, consent_out, notice_in, release_out = entries[1:5]
    spec = servicer.spec_envelope
    # The digests the aggregator computes of what it pushed and what it received.
    assert spec_in["message_digest"] == hashlib.sha256(spec.SerializeToString()).hexdigest()
    assert spec_in["signer"] == spec.key_id
    assert spec_in["spec_digest"] == digest(spec.payload) == release_out["spec_digest"]
    assert spec_in["epsilon"] == 1.0
    assert release_out["message_digest"] == hashlib.sha256(
        servicer.contributions[0].SerializeToString()).hexdigest()
    assert release_out["peer"].startswith("aggregator@127.0.0.1:")
    assert notice_in["signer"] == spec.key_id        # the coordinator key of the spec it carries
    # The release: its statistics' digest and epsilon, never the statistics or n.
    stored = node.ledger.get_release("audited-round")
    c = parse_canonical(stored.envelope.payload, "dpfed.v1.Contribution")
    assert release_out["release_digest"] == hashlib.sha256(c.statistics).hexdigest()
    assert release_out["epsilon"] == pytest.approx(c.epsilon_spent)
    assert set(release_out) == set(audit.FIELDS)          # no n, no statistics: no field for them
    assert consent_out["message_digest"] == hashlib.sha256(servicer.raw[0]).hexdigest()
    # The ledger keeps the log's latest head, the anchor `dpfed site audit --verify` uses.
    anchor = audit.Head.from_json(node.ledger.audit_head())
    contents = audit.read(node.config.audit_path)
    assert anchor.seq == len(contents.rows) - 1
    assert audit.verify(contents, {site_key.key_id: site_key.public_key}, anchor=anchor).ok


def test_no_data_value_or_patient_id_reaches_the_audit_log(served):
    node, *_ = served
    path = node.config.audit_path
    blobs = b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))
    assert blobs, "the audit log has no bytes"
    for s in (b"SENTINEL", SENTINEL_VALUE.encode(), b"7319.42"):
        assert s not in blobs
    # ... while the same sentinels are in the data the round used (the test can fail).
    assert b"SENTINEL7319" in node.config.data.path.read_bytes()


def test_a_refusal_is_logged_with_its_fixed_reason(tmp_path):
    servicer = FakeAggregator(None, fail_first_contribute=False)
    server, port = start_fake(servicer)
    try:
        config_path, coordinator, _ = write_site(tmp_path, aggregator=f"127.0.0.1:{port}")
        servicer.spec_envelope = coordinator.sign(make_spec("too-much", epsilon=3.0))
        node = SiteNode(load_config(config_path))
        _run_site(node, servicer, lambda: bool(servicer.refusals))
    finally:
        server.stop(0)
    refusal = [e for e in _site_entries(node) if e["kind"] == "refusal"][0]
    sent = parse_canonical(servicer.refusals[0].payload, "dpfed.v1.Refusal")
    assert refusal["direction"] == SENT and refusal["outcome"] == "refusal"
    assert refusal["phase"] == "consent" and refusal["reason"] == sent.reason
    assert refusal["epsilon"] == 0.0 and refusal["round_id"] == "too-much"


def test_the_site_stops_answering_when_the_audit_log_cannot_be_written(tmp_path, monkeypatch):
    """Fail closed: the release is debited and stored, but not sent without its audit entry;
    after a restart with a working log it is resent, and logged."""
    servicer = FakeAggregator(None, fail_first_contribute=False)
    server, port = start_fake(servicer)
    try:
        config_path, coordinator, _ = write_site(tmp_path, aggregator=f"127.0.0.1:{port}")
        servicer.spec_envelope = coordinator.sign(make_spec("fail-closed"))
        node = SiteNode(load_config(config_path))
        real = node.audit.append

        def failing(record):
            if record.kind == "contribution":
                raise AuditError("cannot write the audit log: disk I/O error")
            return real(record)
        monkeypatch.setattr(node.audit, "append", failing)
        errors = _run_site(node, servicer, lambda: bool(node.ledger.releases()), timeout=20)
        time.sleep(0.3)
        assert errors and isinstance(errors[0], AuditError)
        assert servicer.contributions == []                     # nothing sent unrecorded
        assert [r.round_id for r in node.ledger.unacknowledged()] == ["fail-closed"]
        assert not node.ledger.get_release("fail-closed").sent
        monkeypatch.setattr(node.audit, "append", real)
        node2 = SiteNode(load_config(config_path))
        _run_site(node2, servicer, lambda: bool(servicer.contributions))
    finally:
        server.stop(0)
    assert len(servicer.contributions) == 1
    sent = [e for e in _site_entries(node2) if e["kind"] == "contribution"]
    assert sent and sent[0]["message_digest"] == hashlib.sha256(
        servicer.contributions[0].SerializeToString()).hexdigest()


# -- dpfed site audit ------------------------------------------------------------------------

def _cli(*argv):
    from dpfed_apps import cli
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["--log-level", "WARNING", *argv])
    return code, out.getvalue(), err.getvalue()


def test_cli_shows_and_verifies_the_site_log(served):
    node, _, config_path, site_key = served
    code, out, _ = _cli("site", "audit", "--config", str(config_path), "--verify")
    assert code == exitcodes.OK
    n = len(audit.read(node.config.audit_path).rows)
    assert out.strip().startswith(f"chain intact: {n} entries, head signed by {site_key.key_id}")
    code, out, _ = _cli("site", "audit", "--config", str(config_path))
    assert code == 0 and "audited-round" in out and "contribution" in out
    code, out, _ = _cli("site", "audit", "--config", str(config_path), "--json", "--verify",
                        "--round", "audited-round", "--limit", "2")
    report = json.loads(out)
    assert code == 0 and set(report) == {"path", "party", "entries", "verify"}
    assert report["party"] == "hospital-a" and len(report["entries"]) == 2
    assert all(e["round_id"] == "audited-round" for e in report["entries"])
    assert set(report["entries"][0]) == set(audit.FIELDS)
    assert report["verify"]["ok"] and report["verify"]["entries"] == n
    assert report["verify"]["anchor"]["seq"] == n - 1


@pytest.mark.parametrize("tamper,kind", [
    ("edit", "edited"), ("delete", "deleted"), ("swap", "reordered"), ("truncate", "deleted"),
    ("remove", "deleted")])
def test_cli_verify_fails_on_a_tampered_site_log(served, tamper, kind):
    node, _, config_path, _ = served
    path = node.config.audit_path
    if tamper == "edit":
        e = _entry(path, 2)
        e["outcome"] = "refusal"
        _tamper(path, ("UPDATE entries SET entry = ? WHERE seq = 2",
                       (json.dumps(e, sort_keys=True, separators=(",", ":")).encode(),)))
    elif tamper == "delete":
        _tamper(path, ("DELETE FROM entries WHERE seq = 2", ()))
    elif tamper == "swap":
        conn = sqlite3.connect(path)
        rows = dict((s, (e, h)) for s, e, h in conn.execute("SELECT seq, entry, hash FROM entries"))
        conn.close()
        _tamper(path, ("UPDATE entries SET entry = ?, hash = ? WHERE seq = 1", rows[3]),
                ("UPDATE entries SET entry = ?, hash = ? WHERE seq = 3", rows[1]))
    elif tamper == "truncate":
        # The last entries and their heads: only the ledger's copy of the head shows it.
        _tamper(path, ("DELETE FROM entries WHERE seq >= 3", ()),
                ("DELETE FROM heads WHERE seq >= 3", ()))
    else:
        for p in path.parent.glob(path.name + "*"):
            p.unlink()
    code, out, err = _cli("site", "audit", "--config", str(config_path), "--verify")
    assert code == exitcodes.AUDIT_FAILED, (out, err)
    assert f"({kind})" in err and "chain intact" not in out
    code, out, _ = _cli("site", "audit", "--config", str(config_path), "--verify", "--json")
    report = json.loads(out)
    assert code == exitcodes.AUDIT_FAILED and not report["verify"]["ok"]
    assert report["verify"]["problem"]["kind"] == kind


def test_cli_without_a_log_or_config(tmp_path):
    config_path, _, _ = write_site(tmp_path)
    code, _, err = _cli("site", "audit", "--config", str(config_path))
    assert code == exitcodes.ERROR and "no audit log" in err
    code, _, err = _cli("site", "audit", "--config", str(tmp_path / "nope.toml"))
    assert code == exitcodes.USAGE


def test_the_audit_log_path_is_a_site_setting(tmp_path):
    config_path, _, _ = write_site(tmp_path)
    assert load_config(config_path).audit_path == tmp_path / "state/ledger.audit.sqlite"
    config_path.write_text(config_path.read_text().replace(
        'signing_key = "keys/site.key"',
        'signing_key = "keys/site.key"\naudit_log = "a/log.sqlite"'))
    assert load_config(config_path).audit_path == tmp_path / "a/log.sqlite"


def test_entry_bytes_are_json_dumps_with_sorted_keys():
    for eps in (None, 0.1, 1e-300, 1 / 3, 5e20):
        record = Record(SENT, "refusal", round_id='r\u00e9"x\\', reason="a\nb\x00c \u2603",
                        epsilon=eps, peer="p")
        obj = record._asdict()
        obj.update(seq=3, time_ms=12345, prev="0" * 64)
        assert audit.entry_bytes(3, 12345, record, "0" * 64) == json.dumps(
            obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    with pytest.raises(ValueError):
        audit.entry_bytes(0, 0, Record(SENT, "x", epsilon=float("nan")), "0" * 64)


# -- the aggregator's log, matched with the sites' ----------------------------------------

@pytest.fixture
def federation_rounds(tmp_path):
    """A real aggregator (in this process) and three SiteNodes with real SiteClient threads:
    one independent and one secure round, then everything stopped (logs committed)."""
    from tests.secure_federation import SecureFed
    fed = SecureFed(tmp_path, n_sites=3)
    try:
        fed.start_aggregator()
        fed.start_clients()
        coordinator = fed.coordinator()
        coordinator.start_round(fed.spec("ind-1", aggregation="independent", noise_threshold=0,
                                         max_site_rows=0, quorum=3))
        status = coordinator.wait("ind-1", 40, poll_s=0.05)
        assert status.state == pb.RoundStatus.DONE, status.message
        coordinator.start_round(fed.spec("sec-1", t=3, quorum=3))
        status = coordinator.wait("sec-1", 40, poll_s=0.05)
        assert status.state == pb.RoundStatus.DONE, status.message
        contributions = [c.envelope for rid in ("ind-1", "sec-1")
                         for c in fed.manager.store.contributions(rid)]
        coordinator.close()
    finally:
        fed.stop()
    return fed, contributions


def test_a_real_round_leaves_matching_entries_in_the_site_and_aggregator_logs(federation_rounds):
    fed, _ = federation_rounds
    agg_path = audit.default_path(fed.tmp / "agg.sqlite")
    contents = audit.read(agg_path)
    key = fed.aggregator_key
    assert audit.verify(contents, {key.key_id: key.public_key}).ok
    agg = audit.entries(contents)
    # Batched: far fewer signed heads than entries.
    assert len(contents.heads) < len(agg) / 2
    started = [e for e in agg if e["kind"] == "spec" and e["direction"] == RECEIVED]
    assert [(e["peer"], e["outcome"], e["round_id"]) for e in started] == [
        ("coord", "started", "ind-1"), ("coord", "started", "sec-1")]
    for site in fed.sites:
        mine = _site_entries(fed.nodes[site])
        k = fed.site_keys[site]
        assert audit.verify(audit.read(fed.nodes[site].config.audit_path),
                            {k.key_id: k.public_key}).ok
        matched = audit.cross_check(mine, agg, theirs_peer=site)
        # Every message the site sent the aggregator recorded receiving, every push the
        # aggregator recorded the site recorded: the same digests on both sides.
        assert matched["missing_in_theirs"] == [] and matched["missing_in_ours"] == [], matched
        sent = [e for e in mine if e["direction"] == SENT]
        assert matched["matched"] == len(mine) - 1 and len(sent) >= 2 + 4  # consents, steps
        kinds = {(e["kind"], e["round_id"]) for e in sent}
        assert ("contribution", "ind-1") in kinds and ("contribution", "sec-1") in kinds
        # A secure release's digest is that of its masked input (its statistics are empty).
        with PrivacyLedger(fed.ledger_path(site)) as ledger:
            stored = ledger.get_release("sec-1")
        masked = parse_canonical(stored.envelope.payload, "dpfed.v1.Contribution").masked
        assert masked and hashlib.sha256(masked).hexdigest() in {
            e["release_digest"] for e in sent if e["round_id"] == "sec-1"}
        received = {}
        for e in agg:
            if e["peer"] == site:
                received.setdefault(e["message_digest"], []).append(e)
        for e in sent:
            theirs = received[e["message_digest"]]
            assert {r["kind"] for r in theirs} == {e["kind"]}
            outcomes = {r["outcome"] for r in theirs}
            if e["kind"] == "contribution" or e["phase"] == "consent":
                assert outcomes == {"accepted"}, (e["kind"], e["phase"], outcomes)
            else:
                # A secure step may arrive after the round has what it needs (or be retried
                # after a slow answer): the aggregator refuses it as out of phase, and both
                # logs say so. Anything else is a failure.
                assert outcomes <= {"accepted", "rejected FAILED_PRECONDITION"}, outcomes


def test_the_aggregator_log_holds_no_statistics(federation_rounds):
    fed, contributions = federation_rounds
    path = audit.default_path(fed.tmp / "agg.sqlite")
    blob = b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))
    assert len(contributions) == 6
    for envelope in contributions:
        payload = json.loads(pb.SignedEnvelope.FromString(envelope).payload)
        statistics = payload.get("statistics") or payload["masked"]
        assert len(statistics) > 100 and statistics[:40].encode() not in blob
        assert statistics[-40:].encode() not in blob
    for e in audit.entries(audit.read(path)):
        assert set(e) == set(audit.FIELDS) and e["release_digest"] == ""


def _aggregator_toml(fed) -> Path:
    path = fed.tmp / "aggregator.toml"
    sites = "".join(f'\n[[sites]]\nsite_id = "{s}"\npublic_key = "{s}.pub"\n' for s in fed.sites)
    path.write_text(f'listen = "127.0.0.1:0"\nstate_db = "agg.sqlite"\ninsecure = true\n'
                    f'signing_key = "aggregator.key"\n{sites}\n[[coordinators]]\n'
                    f'coordinator_id = "coord"\npublic_key = "coord.pub"\n')
    return path


def test_cli_aggregator_audit_and_the_cross_check(federation_rounds):
    fed, _ = federation_rounds
    config = _aggregator_toml(fed)
    code, out, _ = _cli("aggregator", "audit", "--config", str(config), "--verify")
    assert code == 0 and out.startswith("chain intact: ") and fed.aggregator_key.key_id in out
    code, out, _ = _cli("aggregator", "audit", "--config", str(config), "--json",
                        "--round", "ind-1")
    report = json.loads(out)
    assert code == 0 and report["party"] == "aggregator" and "verify" not in report
    assert {e["round_id"] for e in report["entries"]} == {"ind-1"}
    site = fed.sites[0]
    site_toml = fed.tmp / f"{site}.toml"
    agg_log = str(audit.default_path(fed.tmp / "agg.sqlite"))
    code, out, err = _cli("site", "audit", "--config", str(site_toml), "--verify",
                          "--against", agg_log, "--json")
    report = json.loads(out)
    assert code == 0, err
    assert report["verify"]["ok"] and report["against"]["peer"] == "aggregator"
    assert report["against"]["matched"] > 0 and not report["against"]["missing_in_ours"]
    code, out, _ = _cli("aggregator", "audit", "--config", str(config), "--verify",
                        "--against", str(fed.nodes[site].config.audit_path))
    assert code == 0 and "matched with" in out


def test_a_site_log_truncated_with_its_anchor_is_caught_by_the_cross_check(federation_rounds):
    """The site's own tail and the ledger's copy of its head rolled back together: its chain
    verifies alone (undetectable from the site's files), but the aggregator's log holds
    messages received from the site that the site's log no longer records sending."""
    fed, _ = federation_rounds
    site = fed.sites[1]
    node = fed.nodes[site]
    path = node.config.audit_path
    keep = 3
    heads = audit.read(path).heads
    _tamper(path, ("DELETE FROM entries WHERE seq > ?", (keep,)),
            ("DELETE FROM heads WHERE seq > ?", (keep,)))
    node.ledger.close()
    conn = sqlite3.connect(fed.ledger_path(site))
    conn.execute("UPDATE meta SET value = ? WHERE key = 'audit_head'", (heads[keep].to_json(),))
    conn.execute("UPDATE meta SET value = ? WHERE key = 'audit_head_seq'", (str(keep),))
    conn.commit()
    conn.close()
    site_toml = str(fed.tmp / f"{site}.toml")
    code, out, err = _cli("site", "audit", "--config", site_toml, "--verify")
    assert code == 0, err                     # the site's files alone look intact
    agg_log = str(audit.default_path(fed.tmp / "agg.sqlite"))
    code, out, err = _cli("site", "audit", "--config", site_toml, "--verify",
                          "--against", agg_log)
    assert code == exitcodes.AUDIT_FAILED
    assert "never recorded sending" in err and "only in aggregator's log (received)" in out


def test_the_aggregator_refuses_round_messages_when_its_audit_writer_dies(federation):
    """Fail closed: once the writer process is gone (killed here; a disk error reports the
    same way), every audited call is UNAVAILABLE; reads still answer."""
    import grpc
    import os
    import signal
    trail = federation.server.audit
    assert trail is not None and trail.process.poll() is None
    spec = federation.spec("r-fail")
    federation.coordinator.start_round(spec)
    assert trail.flush(10) and trail.failed is None
    os.kill(trail.process.pid, signal.SIGKILL)
    deadline = time.time() + 10
    while trail.failed is None and time.time() < deadline:
        time.sleep(0.02)
    assert "stopped" in trail.failed
    with pytest.raises(grpc.RpcError) as err:
        federation.stub.SendPhase(federation.consent("site-a", "r-fail"))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "audit log cannot be written" in err.value.details()
    assert federation.manager.status("r-fail").round_id == "r-fail"


def test_an_aggregator_whose_audit_log_cannot_be_opened_does_not_start(tmp_path):
    from aggregator.config import config_from_dict
    from aggregator.server import AggregatorServer
    SigningKey.generate().save(tmp_path / "aggregator.key")
    (tmp_path / "not-a-folder").write_text("")
    server = AggregatorServer(config_from_dict(
        {"listen": "127.0.0.1:0", "state_db": "agg.sqlite", "insecure": True,
         "signing_key": "aggregator.key", "audit_log": "not-a-folder/audit.sqlite"}, tmp_path))
    with pytest.raises(AuditError, match="cannot open the audit log"):
        server.start()


def test_the_aggregator_writer_records_what_the_handlers_queue(tmp_path):
    """The writer process, directly: a malformed request, a spec pushed to two sites (one
    description, two entries), a flush, and its figures after close."""
    from aggregator.audit import AuditTrail
    key = SigningKey.generate()
    key.save(tmp_path / "k.key")
    trail = AuditTrail(tmp_path / "a.sqlite", signing_key=tmp_path / "k.key", interval_s=0.01)
    trail.ready()
    spec = key.sign(make_spec("r-w"))
    trail.received("Contribute", b"\xff\x01not protobuf", "rejected INVALID_ARGUMENT")
    trail.sent(spec, "site-a")
    trail.sent(spec, "site-b")
    assert trail.flush(10)
    entries = audit.entries(audit.read(tmp_path / "a.sqlite"))
    assert [(e["kind"], e["peer"], e["outcome"]) for e in entries[1:]] == [
        ("malformed", "", "rejected INVALID_ARGUMENT"), ("spec", "site-a", "pushed"),
        ("spec", "site-b", "pushed")]
    assert entries[2]["message_digest"] == audit.message_digest(spec) == \
        entries[3]["message_digest"]
    trail.close()
    assert trail.process.poll() == 0 and trail.batches >= 1 and trail.cpu_s > 0
    assert audit.verify(audit.read(tmp_path / "a.sqlite"), {key.key_id: key.public_key}).ok


def test_an_aggregator_without_a_signing_key_keeps_no_audit_log(tmp_path):
    from tests.conftest import Federation
    fed = Federation(tmp_path, signing_key=None)
    try:
        assert fed.server.audit is None
    finally:
        fed.stop()
