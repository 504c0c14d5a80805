"""Shared gRPC plumbing for the Tandem services: tensors, servers, interceptors, telemetry, settings, and the
launcher of the whole stack as processes on one machine (stack.py: `tandem serve`, the benches, the e2e tests)."""
