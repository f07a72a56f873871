"""Generated gRPC/protobuf code for the peloton.v1 API (do not edit; run `make proto`)."""
