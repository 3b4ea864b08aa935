"""Generated protobuf and gRPC code for the dpfed.v1 wire schema (see protos/)."""
