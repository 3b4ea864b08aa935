"""The wire format: canonical encoding of signed payloads, Ed25519 signing and key files.

Generated protobuf code lives in ``dpfed.v1`` (from protos/); this package holds the
hand-written rules around it.
"""
