"""Shared gRPC plumbing for the Tandem services: tensors, servers, interceptors, telemetry."""
