"""The gateway: client API, continuous batching, the round driver and its tracing."""
