"""The verifier service: the target model and each request's KV, behind tandem.v1.Verifier."""
