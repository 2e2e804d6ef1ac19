"""What the tests and the benchmarks share: the real server they start, waiting for an event, typed fakes.

Neither imports the other; both import this (the repository root is on
``sys.path``: pytest puts it there for ``tests/``, each benchmark itself).

- :mod:`testkit.waiting`: ``wait_for``, with a deadline that names what never came.
- :mod:`testkit.fakes`: the audit log and the worker processes, as the lifecycle and the scheduler see them.
- :mod:`testkit.platform`: a real server over TLS; :mod:`testkit.raycluster`: a real Ray cluster.
- :mod:`testkit.gossip_rig`, :mod:`testkit.flooding`: worker groups that gossip, floods against a server.
"""
