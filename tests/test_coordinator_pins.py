"""Key pins of secure rounds come from the coordinator's own records, never from the aggregator
(issue 19, item 4; method.md section 12; docs/security.md, "Identity keys relayed by the
aggregator").

The coordinator fills a secure spec's invited sites (sorted; every site of its records when
round.toml lists none) and pins each one's identity key id from its record (``site_keys``: the
CA's public/sites/ folder of <site_id>.pub files). ListSites is asked only to compare: a site
whose listed key id differs from the record, or a site without a record, makes the coordinator
refuse to sign (KeyPinError naming the site; `dpfed round start` exits 4), and nothing reaches
the aggregator. The aggregator's own identity key (it signs every secure-aggregation message it
sends) is pinned the same way, from ``aggregator_key`` (the CA's public/aggregator.pub) into
``aggregator_key_id`` (issue 19, item 7).
"""

from __future__ import annotations

import shutil
import tomllib

import pytest

from coordinator.client import Coordinator, KeyPinError, load_aggregator_key, load_site_keys
from dpfed import exitcodes
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.canonical import parse_canonical
from dpfed.wire.signing import SigningKey

SITES = ("site-a", "site-b", "site-c")


class StubAggregator:
    """Stands in for the aggregator's gRPC stub: ListSites answers what the test says (a lying
    aggregator), StartRound records the signed envelopes it receives."""

    def __init__(self, listed: dict[str, str]):
        self.listed = listed
        self.started: list[pb.SignedEnvelope] = []

    def ListSites(self, request, timeout=None):
        return pb.ListSitesReply(sites=[pb.SiteInfo(site_id=s, key_id=k)
                                        for s, k in self.listed.items()])

    def StartRound(self, envelope, timeout=None):
        self.started.append(envelope)
        spec = parse_canonical(envelope.payload, "dpfed.v1.RoundSpec")
        return pb.RoundStatus(round_id=spec.round_id, state=pb.RoundStatus.CONSENT)

    def signed_spec(self, i: int = -1) -> pb.RoundSpec:
        return parse_canonical(self.started[i].payload, "dpfed.v1.RoundSpec")


def _keys():
    return {s: SigningKey.generate() for s in SITES}


def _records(keys):
    return {s: k.key_id for s, k in keys.items()}


AGGREGATOR_KEY = SigningKey.generate()


def _coordinator(stub, records, aggregator=AGGREGATOR_KEY.public_key):
    c = Coordinator("127.0.0.1:1", SigningKey.generate(), "coord", site_keys=records,
                    aggregator_key=aggregator)
    c.stub = stub
    return c


def _secure_spec(**kw) -> pb.RoundSpec:
    fields = dict(round_id="sec-1", target="y", feature_names=["a", "b"], epsilon=1.0,
                  x_bound=1.0, y_bound=1.0, budget_split=[0.35, 0.6, 0.03, 0.02],
                  deadline_unix_ms=2**45, aggregation="secure", noise_threshold=2,
                  max_site_rows=1000)
    fields.update(kw)
    return pb.RoundSpec(**fields)


def test_substituted_key_ids_in_list_sites_make_the_coordinator_refuse_to_sign():
    """A lying aggregator lists its own key for site-b: the coordinator names site-b and both
    key ids, signs nothing and sends nothing (exit code 4)."""
    keys = _keys()
    records = _records(keys)
    impostor = SigningKey.generate().key_id
    stub = StubAggregator({**records, "site-b": impostor})
    with _coordinator(stub, records) as c:
        with pytest.raises(KeyPinError) as info:
            c.start_round(_secure_spec())
    message = str(info.value)
    assert "site-b" in message and impostor in message and records["site-b"] in message
    assert "site-a" not in message and "site-c" not in message
    assert info.value.exit_code == exitcodes.REFUSED
    assert stub.started == []


def test_a_site_absent_from_the_records_is_refused():
    """round.toml invites site-d, which the coordinator has no record of: refused, even though
    the aggregator lists a key for it (that key cannot be checked)."""
    keys = _keys()
    records = _records(keys)
    stub = StubAggregator({**records, "site-d": SigningKey.generate().key_id})
    with _coordinator(stub, records) as c:
        with pytest.raises(KeyPinError, match="site-d") as info:
            c.start_round(_secure_spec(sites=["site-a", "site-d"]))
    assert "no record" in str(info.value) and info.value.exit_code == exitcodes.REFUSED
    assert stub.started == []


def test_a_coordinator_without_records_signs_no_secure_round_but_independent_ones():
    stub = StubAggregator(_records(_keys()))
    with _coordinator(stub, None) as c:
        with pytest.raises(KeyPinError, match="site_keys") as info:
            c.start_round(_secure_spec())
        assert info.value.exit_code == exitcodes.USAGE and stub.started == []
        independent = _secure_spec(aggregation="", noise_threshold=0, max_site_rows=0,
                                   quorum=1)
        c.start_round(independent)
    assert len(stub.started) == 1
    assert not stub.signed_spec().site_key_ids and not stub.signed_spec().sites


def test_secure_spec_names_its_sites_sorted_and_pins_the_records():
    """sites = [] -> every site of the records, sorted, quorum = their number; a listed set is
    sorted; the pins are the records' key ids. A key id the aggregator hides from this
    coordinator (empty) is not compared: the pin is the record."""
    keys = _keys()
    records = _records(keys)
    stub = StubAggregator({**records, "site-c": ""})
    with _coordinator(stub, records) as c:
        c.start_round(_secure_spec())
        c.start_round(_secure_spec(round_id="sec-2", sites=["site-c", "site-a"], quorum=2))
    first, second = stub.signed_spec(0), stub.signed_spec(1)
    assert list(first.sites) == sorted(SITES) and first.quorum == 3
    assert dict(first.site_key_ids) == records
    assert list(second.sites) == ["site-a", "site-c"]
    assert dict(second.site_key_ids) == {s: records[s] for s in ("site-a", "site-c")}
    assert first.aggregator_key_id == second.aggregator_key_id == AGGREGATOR_KEY.key_id


def test_a_coordinator_without_the_aggregator_record_signs_no_secure_round():
    """No record of the aggregator's identity key: no secure round is signed (exit 2, naming
    aggregator_key), an independent one still is and pins nothing."""
    keys = _keys()
    stub = StubAggregator(_records(keys))
    with _coordinator(stub, _records(keys), aggregator=None) as c:
        with pytest.raises(KeyPinError, match="aggregator_key") as info:
            c.start_round(_secure_spec())
        assert info.value.exit_code == exitcodes.USAGE and stub.started == []
        c.start_round(_secure_spec(aggregation="", noise_threshold=0, max_site_rows=0,
                                   quorum=1))
    assert len(stub.started) == 1 and not stub.signed_spec().aggregator_key_id


def test_a_spec_that_already_pins_another_aggregator_key_is_refused():
    keys = _keys()
    records = _records(keys)
    stub = StubAggregator(records)
    other = SigningKey.generate().key_id
    with _coordinator(stub, records) as c:
        with pytest.raises(KeyPinError, match=other) as info:
            c.start_round(_secure_spec(aggregator_key_id=other))
        assert info.value.exit_code == exitcodes.REFUSED
        c.start_round(_secure_spec(aggregator_key_id=AGGREGATOR_KEY.key_id))   # the record
    assert len(stub.started) == 1


def test_load_aggregator_key_reads_the_cas_public_record(tmp_path):
    """The record is dpfed provision's public/aggregator.pub, the public half of the kit's
    keys/aggregator.key (the aggregator.toml signing_key)."""
    from dpfed_apps.ca import aggregator_key_path, project_from_dict, provision
    provision(project_from_dict({"federation": "pins", "sites": list(SITES),
                                 "coordinators": ["coord"],
                                 "aggregator": {"address": "127.0.0.1:50051"}}), tmp_path)
    kit_key = SigningKey.load(tmp_path / "aggregator" / "keys" / "aggregator.key")
    assert load_aggregator_key(aggregator_key_path(tmp_path)) == kit_key.key_id
    c = Coordinator("127.0.0.1:1", SigningKey.generate(), "coord",
                    aggregator_key=aggregator_key_path(tmp_path))
    assert c.aggregator_record == kit_key.key_id
    c.close()
    with pytest.raises(ValueError, match="aggregator_key"):
        load_aggregator_key(tmp_path / "nowhere.pub")


def test_a_spec_that_already_pins_another_key_than_the_record_is_refused():
    keys = _keys()
    records = _records(keys)
    stub = StubAggregator(records)
    with _coordinator(stub, records) as c:
        with pytest.raises(KeyPinError, match="site-c"):
            c.start_round(_secure_spec(site_key_ids={**records, "site-c": "0" * 32}))
        c.start_round(_secure_spec(site_key_ids=records))    # the same pins: fine
    assert len(stub.started) == 1


def test_load_site_keys_reads_the_cas_public_sites_folder(tmp_path):
    """The record is dpfed provision's public/sites/: <site_id>.pub (Ed25519) beside the TLS
    certificates (<site_id>.pem, ignored)."""
    from dpfed_apps.ca import SITE, project_from_dict, provision, public_dir
    provision(project_from_dict({"federation": "pins", "sites": list(SITES),
                                 "coordinators": ["coord"],
                                 "aggregator": {"address": "127.0.0.1:50051"}}), tmp_path)
    folder = public_dir(tmp_path, SITE)
    records = load_site_keys(folder)
    assert sorted(records) == sorted(SITES)
    for s in SITES:
        kit_key = SigningKey.load(tmp_path / "sites" / s / "keys" / f"{s}.key")
        assert records[s] == kit_key.key_id
    with pytest.raises(ValueError, match="not a folder"):
        load_site_keys(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no <site_id>.pub"):
        load_site_keys(tmp_path / "empty")
    (tmp_path / "empty" / "bad.pub").write_text("not a key")
    with pytest.raises(ValueError, match="bad.pub"):
        load_site_keys(tmp_path / "empty")


# ---- a real aggregator whose registry names a key of its choosing ------------------------------


@pytest.fixture
def lying_federation(tmp_path):
    """The conftest federation, except that the aggregator registers an impostor key (its own)
    for site-b: what its ListSites reports and what it would relay to the other sites."""
    from tests.conftest import Federation
    impostor = SigningKey.generate()
    impostor.save(tmp_path / "impostor.key", tmp_path / "impostor.pub")
    fed = Federation(tmp_path, sites=[
        {"site_id": s, "public_key": "impostor.pub" if s == "site-b" else f"{s}.pub"}
        for s in Federation.SITES])
    fed.impostor = impostor
    yield fed
    fed.stop()


def _secure_round_toml(path, **extra):
    lines = ['target = "y"', 'features = ["x0", "x1", "x2"]', "epsilon = 1.0",
             "x_bound = 0.5", "y_bound = 2.0", 'aggregation = "secure"', "noise_threshold = 2",
             "max_site_rows = 1000", "deadline_s = 60", 'round_id = "sec-cli"',
             *(f"{k} = {v}" for k, v in extra.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


def _records_folder(fed, folder, sites=SITES):
    folder.mkdir()
    for s in sites:
        shutil.copy(fed.tmp / f"{s}.pub", folder / f"{s}.pub")
    return folder


def test_a_real_aggregator_lying_about_a_key_gets_no_signed_secure_round(lying_federation):
    fed = lying_federation
    with pytest.raises(KeyPinError, match="site-b") as info:
        fed.coordinator.start_round(fed.spec(aggregation="secure", noise_threshold=2,
                                             max_site_rows=1000))
    assert fed.impostor.key_id in str(info.value)
    assert fed.manager.list_rounds(0, "").rounds == []
    # An independent round needs no pins and still starts.
    fed.coordinator.start_round(fed.spec(round_id="indep", quorum=1))


def _round_start(fed, tmp_path, capsys, *extra, toml=None):
    from dpfed_apps.cli import main
    spec = _secure_round_toml(tmp_path / "round.toml", **(toml or {}))
    code = main(["round", "start", "--spec", str(spec), "--aggregator", fed.address,
                 "--key", str(fed.tmp / "coordinator.key"), "--coordinator-id", "coord",
                 "--insecure", *extra])
    return code, capsys.readouterr().err


def test_round_start_exit_codes_of_key_pins(lying_federation, tmp_path, capsys):
    """`dpfed round start` of a secure round: 4 and the site named when the aggregator lists
    another key or a site has no record; 2 without --site-keys / site_keys."""
    fed = lying_federation
    records = _records_folder(fed, tmp_path / "records")
    code, err = _round_start(fed, tmp_path, capsys, "--site-keys", str(records))
    assert code == exitcodes.REFUSED and "site-b" in err and fed.impostor.key_id in err
    # round.toml invites site-b, of which these records know nothing (with sites = [] the
    # round would invite the recorded sites only).
    partial = _records_folder(fed, tmp_path / "partial", ("site-a", "site-c"))
    code, err = _round_start(fed, tmp_path, capsys, "--site-keys", str(partial),
                             toml={"sites": '["site-a", "site-b", "site-c"]'})
    assert code == exitcodes.REFUSED and "no record" in err and "site-b" in err
    code, err = _round_start(fed, tmp_path, capsys)
    assert code == exitcodes.USAGE and "site_keys" in err
    assert fed.manager.list_rounds(0, "").rounds == []


def test_round_start_with_honest_records_pins_them_and_the_aggregator_accepts(
        federation, tmp_path, capsys):
    """coordinator.toml's site_keys (relative to the file): the spec the aggregator stores
    names every recorded site, sorted, with the records' key ids."""
    from dpfed_apps.cli import main
    _records_folder(federation, tmp_path / "site-keys")
    config = tmp_path / "coordinator.toml"
    config.write_text(f'aggregator = "{federation.address}"\ncoordinator_id = "coord"\n'
                      f'signing_key = "coordinator.key"\nsite_keys = "site-keys"\n'
                      f"insecure = true\n")
    spec = _secure_round_toml(tmp_path / "round.toml")
    # Without aggregator_key: no record of the aggregator's key, nothing signed (exit 2).
    assert main(["round", "start", "--spec", str(spec), "--config", str(config)]) == 2
    assert "aggregator_key" in capsys.readouterr().err
    assert federation.manager.list_rounds(0, "").rounds == []
    config.write_text(config.read_text() + 'aggregator_key = "aggregator.pub"\n')
    assert main(["round", "start", "--spec", str(spec), "--config", str(config)]) == 0
    capsys.readouterr()
    stored = federation.manager.context.rounds["sec-cli"].spec
    assert list(stored.sites) == list(SITES) and stored.quorum == 3
    assert dict(stored.site_key_ids) == {s: k.key_id for s, k in federation.site_keys.items()}
    assert stored.aggregator_key_id == federation.aggregator_key.key_id
    # --aggregator-key names the same record on the command line.
    spec = tmp_path / "round2.toml"
    spec.write_text((tmp_path / "round.toml").read_text().replace('"sec-cli"', '"sec-cli-2"'))
    assert main(["round", "start", "--spec", str(spec), "--aggregator", federation.address,
                 "--key", str(federation.tmp / "coordinator.key"), "--coordinator-id", "coord",
                 "--insecure", "--site-keys", str(tmp_path / "site-keys"),
                 "--aggregator-key", str(federation.tmp / "aggregator.pub")]) == 0
    capsys.readouterr()
    assert federation.manager.context.rounds["sec-cli-2"].spec.aggregator_key_id == \
        federation.aggregator_key.key_id
    # An unknown key of coordinator.toml is still an error naming the nearest valid one.
    config.write_text(config.read_text() + 'site_key = "x"\n')
    assert main(["round", "start", "--spec", str(spec), "--config", str(config)]) == 2
    assert "did you mean 'site_keys'" in capsys.readouterr().err
    assert tomllib.loads(config.read_text())["site_keys"] == "site-keys"
