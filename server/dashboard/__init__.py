"""The read-only web dashboard: sign-in by one-time links, pages rendered on the server, live loss curves."""
