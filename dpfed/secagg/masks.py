"""Masks: ChaCha20 keystreams read as vectors of Z_{2^64} (Bonawitz et al., CCS 2017, section 3).

Site u sends (Bonawitz et al., "double masking", section 3 and the protocol of Figure 4, round
MaskedInputCollection)

    y_u = x_u + PRG(b_u) + sum_{v in N(u)} sign(u, v) PRG(s_uv)   (mod 2^64),

sign(u, v) = +1 if u < v and -1 if u > v (site ids compared as strings), so that for every pair
both masks appear once with opposite signs and cancel in sum_u y_u. The self-mask PRG(b_u) is
what protects a site whose pairwise masks get removed because it was (or was claimed to be) a
dropout; the aggregator removes it only for surviving sites, from Shamir shares of b_u.

PRG: the ChaCha20 keystream (RFC 8439; ``cryptography``'s ``algorithms.ChaCha20(key, nonce)``
whose 16-byte nonce is the 4-byte little-endian initial block counter followed by the 12-byte
IETF nonce) over 8*length zero bytes, read as little-endian uint64. The counter starts at 0; the
12-byte nonce names the purpose (pairwise or self mask); every seed is used for one vector only
(seeds are fresh per round: HKDF binds the round id and configuration, ``keys.mask_seed``; b_u is
32 fresh random bytes). A 32-bit block counter allows 2^32 * 64 bytes = 2^35 entries per seed.
Under the PRG assumption each PRG output is indistinguishable from uniform on Z_{2^64}^m, hence
so is any y_u that includes at least one mask its observer cannot compute
(tests/test_secagg_masks.py checks this statistically).
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Mapping

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from dpfed.secagg.codec import Writer
from dpfed.secagg.errors import ParameterError
from dpfed.secagg.keys import DOMAIN

__all__ = ["SEED_BYTES", "MAX_LENGTH", "new_self_seed", "expand", "pairwise_sign",
           "pairwise_mask", "self_mask", "mask_input", "commit_self_seed"]

SEED_BYTES = 32
MAX_LENGTH = 2 ** 35
_NONCE_PAIR = b"\x00" * 4 + b"dpfed-pair\x00\x00"
_NONCE_SELF = b"\x00" * 4 + b"dpfed-self\x00\x00"


def new_self_seed() -> bytes:
    """b_u: 32 bytes from the CSPRNG (``secrets``)."""
    return secrets.token_bytes(SEED_BYTES)


def _expand(seed: bytes, length: int, nonce: bytes) -> np.ndarray:
    if len(seed) != SEED_BYTES:
        raise ParameterError("a mask seed is 32 bytes")
    if not 0 <= length <= MAX_LENGTH:
        raise ParameterError(f"mask length must be in [0, 2^35], got {length}")
    enc = Cipher(algorithms.ChaCha20(bytes(seed), nonce), mode=None).encryptor()
    stream = enc.update(bytes(8 * length)) + enc.finalize()
    return np.frombuffer(stream, dtype="<u8").astype(np.uint64)


def expand(seed: bytes, length: int, *, purpose: str = "pair") -> np.ndarray:
    """PRG(seed): ``length`` uint64 words of the ChaCha20 keystream ("pair" or "self" nonce)."""
    if purpose not in ("pair", "self"):
        raise ParameterError("purpose must be 'pair' or 'self'")
    return _expand(seed, length, _NONCE_PAIR if purpose == "pair" else _NONCE_SELF)


def pairwise_sign(me: str, other: str) -> int:
    """+1 for the smaller site id of the pair, -1 for the larger."""
    if me == other:
        raise ParameterError("a site has no pairwise mask with itself")
    return 1 if me < other else -1


def pairwise_mask(seed: bytes, me: str, other: str, length: int) -> np.ndarray:
    """sign(me, other) PRG(s_uv) mod 2^64: what ``me`` adds for the pair (me, other)."""
    m = expand(seed, length, purpose="pair")
    return m if pairwise_sign(me, other) > 0 else np.zeros_like(m) - m


def self_mask(self_seed: bytes, length: int) -> np.ndarray:
    return expand(self_seed, length, purpose="self")


def mask_input(x, self_seed: bytes, pair_seeds: Mapping[str, bytes], me: str) -> np.ndarray:
    """y_u = x_u + PRG(b_u) + sum_v sign(u, v) PRG(s_uv) mod 2^64."""
    x = np.asarray(x)
    if x.dtype != np.uint64 or x.ndim != 1:
        raise ParameterError("the input must be a 1-d uint64 vector (fixedpoint.encode)")
    y = x + self_mask(self_seed, x.size)
    for other, seed in pair_seeds.items():
        m = expand(seed, x.size, purpose="pair")
        if pairwise_sign(me, other) > 0:
            y += m
        else:
            y -= m
    return y


def commit_self_seed(self_seed: bytes, *, round_id: str, config_digest: bytes,
                     site_id: str) -> bytes:
    """SHA-256 commitment to b_u, published (signed) with the site's keys, so the aggregator can
    tell a correctly reconstructed b_u from one spoiled by a bad share. b_u has 256 bits of
    entropy, so the hash reveals nothing usable about it."""
    data = (Writer().fixed(DOMAIN, len(DOMAIN)).blob(b"self-seed-commitment").text(round_id)
            .blob(config_digest).text(site_id).fixed(self_seed, SEED_BYTES).getvalue())
    return hashlib.sha256(data).digest()
