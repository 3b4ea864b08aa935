"""The one error type of the aggregator's request handling: a request it refuses, with the
gRPC status code the servicer (aggregator.service) answers it with."""

from __future__ import annotations


class Rejected(Exception):
    """A request the aggregator refuses. ``code`` is the name of a grpc.StatusCode."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

