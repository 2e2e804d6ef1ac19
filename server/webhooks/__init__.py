"""Webhook subscriptions: their targets, the events they get, the store, and signed delivery."""
