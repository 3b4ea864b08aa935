"""Who may talk to the aggregator: registered site keys and coordinator keys, and which sites
are connected right now."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from dpfed.wire.signing import key_id, load_public_key

from aggregator.config import AggregatorConfig, ConfigError, KeyEntry


@dataclass
class SiteRecord:
    site_id: str
    key_id: str
    public_key: Ed25519PublicKey
    connected_streams: int = 0
    last_seen_unix_ms: int = 0


class Registry:
    """Key id -> party, for sites and coordinators. Key ids are unique across both kinds so a
    site key can never start a round and a coordinator key can never contribute."""

    def __init__(self, sites: dict[str, Ed25519PublicKey],
                 coordinators: dict[str, Ed25519PublicKey]):
        self._lock = threading.Lock()
        self.sites: dict[str, SiteRecord] = {}
        self.site_keys: dict[str, Ed25519PublicKey] = {}
        self._site_by_key: dict[str, str] = {}
        self.coordinator_keys: dict[str, Ed25519PublicKey] = {}
        self._coordinator_by_key: dict[str, str] = {}
        for site_id, pub in sites.items():
            kid = key_id(pub)
            if kid in self._site_by_key:
                raise ConfigError(f"sites {self._site_by_key[kid]!r} and {site_id!r} share a key")
            self.sites[site_id] = SiteRecord(site_id, kid, pub)
            self.site_keys[kid] = pub
            self._site_by_key[kid] = site_id
        for coord_id, pub in coordinators.items():
            kid = key_id(pub)
            if kid in self._site_by_key or kid in self._coordinator_by_key:
                raise ConfigError(f"coordinator {coord_id!r} reuses a registered key")
            self.coordinator_keys[kid] = pub
            self._coordinator_by_key[kid] = coord_id

    @classmethod
    def from_config(cls, config: AggregatorConfig) -> "Registry":
        def load(entries: tuple[KeyEntry, ...]) -> dict[str, Ed25519PublicKey]:
            out = {}
            for e in entries:
                try:
                    out[e.party_id] = load_public_key(e.public_key)
                except (OSError, ValueError) as exc:
                    raise ConfigError(f"public key of {e.party_id!r}: {exc}") from None
            return out
        return cls(load(config.sites), load(config.coordinators))

    def site_of_key(self, kid: str) -> str | None:
        return self._site_by_key.get(kid)

    def coordinator_of_key(self, kid: str) -> str | None:
        return self._coordinator_by_key.get(kid)

    def key_of_coordinator(self, coordinator_id: str) -> str | None:
        """The registered key id of ``coordinator_id`` (None if it is not registered)."""
        for kid, cid in self._coordinator_by_key.items():
            if cid == coordinator_id:
                return kid
        return None

    def site_ids(self) -> list[str]:
        return sorted(self.sites)

    def mark_connected(self, site_id: str, now_ms: int) -> None:
        with self._lock:
            rec = self.sites[site_id]
            rec.connected_streams += 1
            rec.last_seen_unix_ms = now_ms

    def mark_disconnected(self, site_id: str, now_ms: int) -> None:
        with self._lock:
            rec = self.sites[site_id]
            rec.connected_streams = max(0, rec.connected_streams - 1)
            rec.last_seen_unix_ms = now_ms

    def touch(self, site_id: str, now_ms: int) -> None:
        with self._lock:
            self.sites[site_id].last_seen_unix_ms = now_ms

    def snapshot(self) -> list[SiteRecord]:
        with self._lock:
            return [SiteRecord(r.site_id, r.key_id, r.public_key, r.connected_streams,
                               r.last_seen_unix_ms) for _, r in sorted(self.sites.items())]
