"""The small vocabulary every part of the site node shares, below all of them: the payload
types of the messages a site receives and sends, their timestamps and nonces, and the fixed
reason of a release that failed at the site.

The site's own modules are layered; imports point down only:

    site_node.node      the site's answers (consent, handle_notice, handle_round); composes
                        site_node.secure and, to serve, runs site_node.client
    site_node.secure    a secure round's steps, given the node that holds the keys and ledger
    site_node.client    the gRPC client (transport, the RPC calls), given the node to ask
    site_node.messages  (this module), site_node.ledger, .policy, .data, .rows, .release

No module here imports anything of site_node, so none of them imports another back
(tests/test_architecture.py fails on any import cycle).
"""

from __future__ import annotations

import secrets
import time

__all__ = ["CONTRIBUTION", "REFUSAL", "PHASE_MESSAGE", "PHASE_NOTICE", "ROUND_SPEC",
           "RELEASE_FAILED", "now_ms", "new_nonce"]

CONTRIBUTION = "dpfed.v1.Contribution"
REFUSAL = "dpfed.v1.Refusal"
PHASE_MESSAGE = "dpfed.v1.PhaseMessage"
PHASE_NOTICE = "dpfed.v1.PhaseNotice"
ROUND_SPEC = "dpfed.v1.RoundSpec"

#: The reason of a release that failed at the site for an internal error (not reached with
#: valid data: every row problem leaves that row out). Fixed text: the detail stays local.
RELEASE_FAILED = "release failed at the site (see site log)"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def new_nonce() -> str:
    """128 random bits, hex, from the OS CSPRNG: the aggregator never accepts a nonce twice."""
    return secrets.token_hex(16)
