"""gRPC servicers of the control plane, one module per service."""
