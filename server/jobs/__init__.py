"""A job's way through the control plane: its spec, admission, the queue and scheduler, lifecycle and restarts."""
