"""Serving the control plane's ports: gRPC servers, TLS, health, per-principal stream caps, connection limits, the access log and the metrics endpoint."""
