"""Hyperparameter sweeps (issue 36): a search space over job fields, explored server-side by Optuna.

:mod:`.space` checks a sweep's spec and turns it into Optuna's terms;
:mod:`.store` keeps the sweeps in the control-plane database; :mod:`.runner`
asks Optuna for trials, submits each as an ordinary job of the tenant, reports
the trials' validation losses to the pruner and cancels the jobs it prunes.
Optuna's own state (trials, intermediate values, the pruner's rungs) is in its
RDB storage, a SQLite file beside the server's database; a trial's job has the
request id ``<sweep id>-t<number>``, so that a server restarted between the two
submits it once.
"""
