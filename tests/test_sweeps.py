"""Sweeps end to end: a real server over TLS, real worker processes, Optuna's pruner stopping real trials.

The server restart test kills the module's server, so it comes last.
"""

from __future__ import annotations

import http.client
import ssl
import time
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from cantata.sdk import errors
from cantata.sdk.job import Job
from cantata.sdk.sweeps import Sweep, progress_line
from testkit.platform import Platform, cli, free_port
from testkit.waiting import JOB_TIMEOUT_S, wait_for
from tests.browser import chromium, screenshot, signed_in

# Tiny trials, evaluated often: ASHA's first rung (3 steps) comes long before a trial's end (60 steps).
TRIAL: dict[str, Any] = dict(
    name="tiny", model="gpt-tiny", steps=60, eval_every=3, eval_batches=1, batch_size=4, seq_len=16
)
SPACE = {"lr": {"low": 1e-5, "high": 3e-1, "log": True}, "warmup_steps": {"low": 0, "high": 20}}


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    """The module's server, with the dashboard on (its sweep pages are checked here)."""
    p = Platform(tmp_path_factory.mktemp("sweeps"), settings={"dashboard_listen": f"127.0.0.1:{free_port()}"})
    p.start()
    yield p
    if p.proc is not None:
        p.stop()


def _dashboard_get(platform: Platform, client, path: str) -> tuple[int, str]:
    """GET ``path`` from the dashboard, signed in as ``client``'s tenant by a fresh login link."""
    link = urlsplit(client.dashboard_login().url)
    context = ssl.create_default_context(cadata=platform.ca_pem.decode())
    context.check_hostname = False
    connection = http.client.HTTPSConnection(link.hostname, link.port, context=context)
    try:
        connection.request("GET", link.path)
        response = connection.getresponse()
        response.read()
        cookie = response.getheader("set-cookie", "").split(";")[0]
        connection.request("GET", path, headers={"Cookie": cookie})
        page = connection.getresponse()
        return page.status, page.read().decode()
    finally:
        connection.close()


def _sweep(**overrides) -> Sweep:
    fields = dict(job=Job(**TRIAL), parameters=SPACE, trials=12, concurrency=3, sampler="random", seed=7)
    return Sweep(**{**fields, **overrides})


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (dict(parameters={"lr": {"low": 0.1, "high": 0.01}}), "parameters[0]"),  # an empty range
        (dict(parameters={"lr": {"low": 0.0, "high": 0.1, "log": True}}), "parameters[0]"),  # log of 0
        (dict(parameters={"name": {"choices": ["a", "b"]}}), "parameters[0].field"),  # not tunable
        (dict(parameters={"warmup_steps": {"choices": ["ten"]}}), "parameters[0]"),  # not an int
        (dict(sampler="grid"), "parameters[0]"),  # a float range has no grid
        (dict(sampler="grid", parameters={"warmup_steps": {"choices": [1, 2]}}), "trials"),  # 12 > 2 points
        (dict(pruner="median"), "pruner"),
        (dict(trials=0), "trials"),
        (dict(job=Job(**{**TRIAL, "eval_every": 0})), "job.eval_every"),
    ],
)
def test_a_bad_sweep_is_refused_with_the_field_named_and_recorded(tenant, overrides, field):
    with pytest.raises(errors.InvalidArgument) as refused:
        tenant.sweeps.submit(_sweep(**overrides))
    assert field in str(refused.value), refused.value
    assert not [s for s in tenant.sweeps.list() if s.name == "refused"]
    records = list(tenant.audit_events(action="sweep_submitted"))
    assert records[-1].outcome == "refused" and field in records[-1].details["message"]


def test_a_trial_job_out_of_range_is_an_invalid_job(tenant):
    with pytest.raises(errors.InvalidJob, match=r"parameters\.warmup_steps"):  # warm-up past the job's 60 steps
        tenant.sweeps.submit(_sweep(parameters={"warmup_steps": {"low": 100, "high": 200}}))


def test_another_tenant_cannot_see_or_cancel_a_sweep(platform, tenant):
    sweep = tenant.sweeps.submit(_sweep(name="private", trials=1, concurrency=1))
    with platform.enroll("rival") as rival:
        for call in (rival.sweeps.get, rival.sweeps.cancel):
            with pytest.raises(errors.NotFound):
                call(sweep.id)
        assert rival.sweeps.list() == []
        assert _dashboard_get(platform, rival, f"/sweeps/{sweep.id}")[0] == 404
    cancelled = tenant.sweeps.cancel(sweep.id)
    assert cancelled.state == "CANCELLED" and cancelled.reason == "cancelled by tenant"
    wait_for(
        lambda: all(tenant.get(t.job_id).terminal for t in tenant.sweeps.get(sweep.id).trials if t.job_id),
        timeout=JOB_TIMEOUT_S,
    )
    # the runner's next pass (every 0.25 s) records the cancelled trial's end: no trial is left running
    wait_for(lambda: all(t.state != "RUNNING" for t in tenant.sweeps.get(sweep.id).trials), timeout=JOB_TIMEOUT_S)
    assert [t.state for t in tenant.sweeps.get(sweep.id).trials] in ([], ["FAIL"])
    actions = [e.action for e in tenant.audit_events() if e.resource == sweep.id]
    assert actions[0] == "sweep_submitted" and "sweep_cancel_requested" in actions


def test_asha_prunes_a_third_of_twelve_trials_and_reports_the_best(platform, tenant, tmp_path):
    submitted = tenant.sweeps.submit(_sweep(name="asha"))
    t0 = time.monotonic()
    status = tenant.sweeps.wait(
        submitted.id, on_change=lambda s: print(round(time.monotonic() - t0, 1), progress_line(s))
    )
    assert status.state == "SUCCEEDED", status.reason
    assert len(status.trials) == 12 and len({t.job_id for t in status.trials}) == 12
    pruned = [t for t in status.trials if t.state == "PRUNED"]
    completed = [t for t in status.trials if t.state == "COMPLETE"]
    print(f"pruned {len(pruned)}, completed {len(completed)}: {[t.step for t in pruned]}")
    assert len(pruned) >= 4, status.trials
    assert len(pruned) + len(completed) == 12
    assert status.best is not None and status.best.value == min(t.value for t in completed)
    for trial in pruned:  # stopped early: its job was cancelled as pruned before its last step
        job = tenant.get(trial.job_id)
        assert (job.state, job.reason) == ("CANCELLED", "pruned") and job.step < TRIAL["steps"], job
        assert trial.step < TRIAL["steps"]
    best = tenant.get(status.best.job_id)
    assert best.state == "SUCCEEDED" and best.val_loss == pytest.approx(status.best.value)
    assert f"sweep={status.id}" in best.tags
    assert {j.id for j in tenant.list(tag=f"sweep={status.id}")} == {t.job_id for t in status.trials}
    actions = [e.action for e in tenant.audit_events() if e.resource == status.id]
    assert actions.count("sweep_trial_started") == 12 and actions.count("sweep_trial_pruned") == len(pruned)
    assert actions[0] == "sweep_submitted" and actions[-1] == "sweep_finished"
    shown = cli("sweeps", "show", status.id, "--profile", "acme").stdout
    assert f"best: trial {status.best.number}" in shown and shown.count("PRUNED") == len(pruned)
    cli("sweeps", "plot", status.id, "--out", str(tmp_path), "--profile", "acme")
    assert {p.name for p in tmp_path.iterdir()} == {f"{status.id}-parallel.png", f"{status.id}-val_loss.png"}
    code, listing = _dashboard_get(platform, tenant, "/sweeps")
    assert code == 200 and f'href="/sweeps/{status.id}"' in listing and "SUCCEEDED" in listing
    code, detail = _dashboard_get(platform, tenant, f"/sweeps/{status.id}")
    assert code == 200 and detail.count("<td>PRUNED</td>") == len(pruned)
    assert f'href="/jobs/{status.best.job_id}"' in detail and f"{status.best.number} (best)" in detail
    with chromium(platform.data_dir / "server.pem") as browser:  # as a person sees them (and the docs' images)
        context, page = signed_in(browser, tenant.dashboard_login().url)
        page.click("nav >> text=Sweeps")
        expect(page.locator(f'a[href="/sweeps/{status.id}"]')).to_be_visible()
        screenshot(page, "sweeps", tmp_path)
        page.click(f'a[href="/sweeps/{status.id}"]')
        expect(page.get_by_role("cell", name="PRUNED", exact=True)).to_have_count(len(pruned))
        screenshot(page, "sweep", tmp_path)
        context.close()


def test_a_suspended_tenants_sweep_is_cancelled_and_starts_no_trial(platform):
    with platform.enroll("lapsed") as lapsed, platform.admin() as admin:
        sweep = lapsed.sweeps.submit(_sweep(name="lapsed", trials=3, concurrency=1))
        wait_for(lambda: any(t.job_id for t in lapsed.sweeps.get(sweep.id).trials), timeout=JOB_TIMEOUT_S)
        admin.suspend_tenant("lapsed", "unpaid")
        wait_for(lambda: list(admin.audit_events(tenant="lapsed", action="sweep_finished")), timeout=JOB_TIMEOUT_S)
        admin.resume_tenant("lapsed")  # to read what became of it
        status = wait_for(
            lambda: (s := lapsed.sweeps.get(sweep.id)).trials[0].state == "FAIL" and s, timeout=JOB_TIMEOUT_S
        )
        assert (status.state, status.reason) == ("CANCELLED", "tenant suspended")
        assert len(status.trials) == 1
        assert (
            wait_for(lambda: (j := lapsed.get(status.trials[0].job_id)).terminal and j, timeout=JOB_TIMEOUT_S).state
            == "CANCELLED"
        )


def test_a_sweep_goes_on_after_its_server_is_killed(platform, tenant):
    """SIGKILL mid-sweep: the next server finishes it, every trial once, none lost or run twice."""
    job = Job(**{**TRIAL, "steps": 30, "eval_every": 15})
    sweep = tenant.sweeps.submit(_sweep(name="restart", job=job, trials=4, concurrency=2, pruner="none"))
    wait_for(
        lambda: sum(bool(t.job_id) for t in tenant.sweeps.get(sweep.id).trials) >= 2, timeout=JOB_TIMEOUT_S
    )  # two running
    platform.kill()
    platform.start()
    status = tenant.sweeps.wait(sweep.id)
    assert status.state == "SUCCEEDED", status.reason
    assert [t.number for t in status.trials] == [0, 1, 2, 3]
    assert all(t.state == "COMPLETE" for t in status.trials), status.trials
    jobs = tenant.list(tag=f"sweep={sweep.id}")
    assert sorted(j.id for j in jobs) == sorted(t.job_id for t in status.trials)  # no job without its trial
    assert sorted(j.name for j in jobs) == [f"restart-t{n}" for n in range(4)]
