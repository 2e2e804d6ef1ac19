"""Worker processes on this machine: the launcher, its zygote, sandbox, uids, rendezvous and secrets."""
