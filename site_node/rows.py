"""Which of a site's rows a round uses: row-wise rules only, and a keyed cap on their number.

Nothing a site answers may depend on its private data for free (method.md section 12, issue
19). So no property of the rows decides whether the site answers; each rule below decides, for
one row at a time, whether *that row* is used, from the row itself and public parameters:

* ``finite_after_preprocessing``: a row whose public pre-processing gives a non-finite number
  (a value of 1e300 whose row norm overflows) is left out, as site_node.data leaves out rows
  with a missing target or a malformed value. Under add/remove such a rule changes nothing in
  the neighbour relation: a data set with one more left-out row gives the same used rows.
* ``keep_at_most``: a secure round bounds each site's rows by its public ``max_site_rows`` m
  (fixed-point overflow, and the float-error term of the grid sensitivity). A site with more
  usable rows than m keeps exactly m of them, those whose keyed tag is smallest, and leaves
  the rest out, instead of refusing (a refusal would answer "n > m" for free, and a binary
  search over signed specs would find n). The tag of a row is
  HMAC-SHA256(K_round, SHA-256(the row's full record)) with K_round = HMAC-SHA256(K_site,
  round id) and K_site derived from the site's Ed25519 signing key (``row_order_key``): it
  depends on the row's own content, the round id and the site's secret, and on nothing else
  (not on the other rows, their positions, or any other field of the spec). So adding a row
  changes no other row's tag: the kept rows change by at most one addition, one removal or
  one *replacement* (the new row pushes the m-th out), which is what
  ``dpfed.sensitivity.capped_relation`` prices. Deterministic: a retry of the round keeps the
  same rows. Keyed: nobody without the site's key can tell which rows a round kept.
"""

from __future__ import annotations

import hashlib
import hmac

import numpy as np
from cryptography.hazmat.primitives import serialization

__all__ = ["finite_after_preprocessing", "row_order_key", "row_tags", "keep_at_most"]

_KEY_LABEL = b"dpfed/row-order/v1"


def finite_after_preprocessing(preprocessing, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Boolean mask of the rows whose public pre-processing (``dpfed.preprocess.
    Preprocessing.apply``) gives only finite numbers: centring, the squared row norm when rows
    are normalised, and the centred target. A row-wise rule (module docstring)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        z = x - np.asarray(preprocessing.x_mean, dtype=np.float64)
        ok = np.isfinite(z).all(axis=1) if z.size else np.ones(x.shape[0], dtype=bool)
        if preprocessing.normalize_rows:
            ok &= np.isfinite(np.einsum("ij,ij->i", z, z))
        ok &= np.isfinite(y - preprocessing.y_mean)
    return ok


def row_order_key(signing_key) -> bytes:
    """K_site: a 32-byte secret for ordering rows, derived from the site's persistent Ed25519
    signing key (``dpfed.wire.signing.SigningKey``) under its own label, so that it is stable
    across restarts and never leaves the site (the signing key does not either)."""
    seed = signing_key.private_key.private_bytes(serialization.Encoding.Raw,
                                                 serialization.PrivateFormat.Raw,
                                                 serialization.NoEncryption())
    return hmac.new(seed, _KEY_LABEL, hashlib.sha256).digest()


def row_tags(site_key: bytes, round_id: str, digests) -> list[bytes]:
    """The keyed tag of each row: HMAC-SHA256(K_round, digest) with K_round =
    HMAC-SHA256(``site_key``, round id); ``digests`` are the rows' content digests
    (site_node.data.RoundData.digests)."""
    round_key = hmac.new(site_key, b"round\x00" + round_id.encode("utf-8"),
                         hashlib.sha256).digest()
    return [hmac.new(round_key, bytes(dg), hashlib.sha256).digest() for dg in digests]


def keep_at_most(m: int, site_key: bytes, round_id: str, digests) -> np.ndarray:
    """Indices (ascending) of the rows to use when at most ``m`` may be: all of them if there
    are at most m, else the m whose ``row_tags`` are smallest (ties, i.e. identical records,
    broken by position: they contribute identically). Deterministic in (site_key, round_id,
    digests)."""
    digests = list(digests)
    if m < 0:
        raise ValueError("the row cap must be >= 0")
    if len(digests) <= m:
        return np.arange(len(digests))
    tags = row_tags(site_key, round_id, digests)
    order = sorted(range(len(digests)), key=lambda i: (tags[i], i))
    return np.sort(np.asarray(order[:m], dtype=np.int64))
