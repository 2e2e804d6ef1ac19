"""Security primitives: PKI, audit log, checkpoint encryption and keys, gradient-anomaly screening."""
