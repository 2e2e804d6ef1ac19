"""The control plane: services, authentication and authorization, store, scheduler, worker launcher."""
