"""The web dashboard in a real headless Chromium (Debian's ``chromium``, driven by Playwright).

One server with the dashboard on, two tenants, and one real training job of
``acme``'s shared by the module (a second, shorter one is submitted while the
job list is open). The browser signs in with links from the real CLI and SDK,
watches the job's chart and events grow from server-sent events (waiting on
the page's DOM, never a sleep), sees its config and a chart for every series
of its metrics history, follows a job's logs live, sees the list refresh with
a new job, filters it and compares two jobs; it is refused another tenant's
job on every page, a used link and an expired one, and renders a job name full
of markup as text. The browser trusts the test server's certificate by its
public key (``--ignore-certificate-errors-spki-list``), not by ignoring TLS
errors.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
from playwright.sync_api import expect

from cantata.sdk import Job
from testkit.platform import Platform, cli, free_port
from testkit.waiting import JOB_TIMEOUT_S, wait_for
from tests.browser import chromium, screenshot, signed_in

LINK_SECONDS = 20  # the test server's login links; the expired-link test waits this long at most
XSS_NAME = 'tiny-gpt <img src=x onerror="window.__xss=1"><script>window.__xss=2</script>&amp;'
# The docs' screenshots: CANTATA_DASHBOARD_SCREENSHOTS=docs/images pytest tests/test_dashboard.py writes
# dashboard-{job,jobs,logs,compare}.png there (tests.browser).
JOB = dict(model="gpt-tiny", steps=40, eval_every=20, checkpoint_every=20, batch_size=8, seq_len=32)
SECOND = dict(JOB, steps=20, eval_every=10, checkpoint_every=10, lr=1e-3)  # submitted while the list is open

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    platform = Platform(
        tmp_path_factory.mktemp("dashboard"),
        settings={"dashboard_listen": f"127.0.0.1:{free_port()}", "dashboard_link_seconds": LINK_SECONDS},
    )
    platform.start()
    yield platform
    platform.stop()


@pytest.fixture(scope="module")
def acme(server):
    with server.enroll("acme") as client:
        yield client


@pytest.fixture(scope="module")
def rival(server):
    with server.enroll("rival") as client:
        yield client


@pytest.fixture(scope="module")
def expired_link(acme):
    """A link asked for before anything else, so that it has expired by the last test."""
    return acme.dashboard_login()


@pytest.fixture(scope="module")
def job(acme, expired_link):
    return acme.submit(Job(name=XSS_NAME, tags=["nightly"], **JOB))


@pytest.fixture(scope="module")
def browser(server):
    with chromium(server.data_dir / "server.pem") as browser:
        yield browser


def test_login_link_then_live_chart_and_escaped_name(server, acme, job, browser, tmp_path):
    reply = json.loads(cli("dashboard", "--profile", "acme", "--json", env=server.env).stdout)
    assert reply["url"].startswith("https://127.0.0.1:") and "/login/" in reply["url"]
    context, page = signed_in(browser, reply["url"])
    console: list[str] = []
    page.on("console", lambda message: console.append(message.text))
    assert page.url.endswith("/")  # redirected from the login link to the job list
    cookie = next(c for c in context.cookies() if c["name"] == "__Host-cantata_session")
    assert cookie["httpOnly"] and cookie["secure"] and cookie["sameSite"] == "Strict"
    assert page.locator("#jobs td.name").first.text_content() == XSS_NAME  # shown as text, not markup

    wait_for(lambda: acme.get(job.id).state in ("RUNNING", "SUCCEEDED"), timeout=JOB_TIMEOUT_S)
    response = page.goto(f"{reply['url'].split('/login/')[0]}/jobs/{job.id}")
    assert response is not None and response.status == 200
    headers = response.headers
    assert "script-src 'self'" in headers["content-security-policy"]
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY" and headers["cache-control"] == "no-store"
    # The chart grows: a first batch, then more pushed while the job runs, to its end. (The page's CSP
    # forbids eval, so the waits are on attributes through selectors, with no timeout but the test's.)
    chart = page.locator("#chart")
    expect(chart).not_to_have_attribute("data-points", "0", timeout=0)
    first = int(chart.get_attribute("data-points"))
    page.locator("#chart[data-ended='true']").wait_for(timeout=0)
    assert int(chart.get_attribute("data-points")) > first
    assert page.locator("#state").text_content() == "SUCCEEDED"
    assert len(page.locator("#line-loss").get_attribute("points").split()) == JOB["steps"]  # one report a step
    assert len(page.locator("#line-val_loss").get_attribute("points").split()) == 2

    page.reload()  # the events and checkpoints tables are rendered on the server: the ended job's
    page.locator("#chart[data-ended='true']").wait_for(timeout=0)
    assert page.locator("#job-name").text_content() == XSS_NAME
    assert page.locator("#job-name img, #job-name script").count() == 0
    assert page.evaluate("window.__xss") is None
    assert not [line for line in console if "Content Security Policy" in line]  # the pages need nothing inline
    assert page.locator("#checkpoints tbody tr").count() == 2
    assert page.locator("#workers tbody tr").count() == 1
    assert page.locator("#workers td.memory").text_content().endswith(" MiB")  # from the worker's heartbeat
    # Every event row says what happened (a step's progress is in the charts, not the table); a healthy
    # state is not drawn as an error.
    whats = page.locator("#events tbody tr td:last-child").all_text_contents()
    assert whats and all(whats) and "SUCCEEDED" in whats
    assert page.locator(".reason-failed, #state.state-failed").count() == 0
    # The config panel: the job's settings as it ran them.
    config = dict(
        zip(
            page.locator("#config-table th").all_text_contents(),
            page.locator("#config-table td").all_text_contents(),
            strict=True,
        )
    )
    assert config["steps"] == "40" and config["model"] == "gpt-tiny" and config["tags"] == '["nightly"]'
    # A chart for every series of the metrics history, each with a point per report of it.
    page.locator("#metrics[data-final='true']").wait_for(timeout=0)
    history = [r for r in acme.metrics(job.id) if r.peer is None]
    names = {r.name for r in history}
    assert {"loss", "val_loss", "lr", "tokens_per_s", "step_time_s", "data_wait_s", "memory_bytes"} <= names
    assert {f"metric-{n}" for n in names} == set(
        page.locator("#metrics figure").evaluate_all("fs => fs.map(f => f.id)")
    )
    for name in names:
        drawn = page.locator(f"#metric-{name}").get_attribute("data-points")
        assert drawn == str(sum(r.name == name and r.value == r.value for r in history)), name  # NaN: a gap
    screenshot(page, "job", tmp_path)
    context.close()


def test_the_list_refreshes_filters_and_compares_and_logs_follow_a_new_job(server, acme, job, browser, tmp_path):
    context, page = signed_in(browser, acme.dashboard_login().url)
    base = page.url.rstrip("/")
    table = page.locator("#jobs")
    page.locator("#jobs[data-refreshed]").wait_for(timeout=0)  # read from /jobs.json once
    assert table.get_attribute("data-rows") == "1"
    second = acme.submit(Job(name="second run", tags=["sweep-a"], **SECOND))
    logs = context.new_page()  # the new job's logs, open before its worker has started: its lines arrive live
    logs.goto(f"{base}/jobs/{second.id}/logs")
    expect(logs.locator("#live")).to_have_text("live", timeout=0)
    log = logs.locator("#log")
    first = int(log.get_attribute("data-lines"))

    page.locator("#jobs[data-rows='2']").wait_for(timeout=0)  # the open list shows it without a reload
    assert page.locator(f"#jobs tr[data-job='{second.id}'] td.name").text_content() == "second run"

    logs.locator("#log[data-ended='true']").wait_for(timeout=0)
    total = int(log.get_attribute("data-lines"))
    assert total > first, (first, total)
    shown = [f"[{worker}] {line}" for worker, line in acme.logs(second.id)]
    assert log.text_content().splitlines() == shown[:total]  # every line, once, in order
    assert "step 20/20" in log.text_content()
    assert logs.locator("#state").text_content() == "SUCCEEDED"  # the end says how it ended
    screenshot(logs, "logs", tmp_path)

    page.fill("#filter", "sweep-a")  # search matches a tag
    expect(table).to_have_attribute("data-rows", "1", timeout=0)
    assert page.locator("#jobs tbody tr").get_attribute("data-job") == second.id
    page.fill("#filter", "")
    page.select_option("#state-filter", "SUCCEEDED")
    expect(table).to_have_attribute("data-rows", "2", timeout=0)
    page.select_option("#state-filter", "FAILED")
    expect(table).to_have_attribute("data-rows", "0", timeout=0)
    assert page.locator("#no-jobs").is_visible()
    page.select_option("#state-filter", "")
    page.click("th[data-sort='step']")  # ascending: the 20-step job first
    assert page.locator("#jobs tbody tr").first.get_attribute("data-job") == second.id
    screenshot(page, "jobs", tmp_path)

    for job_id in (job.id, second.id):
        page.check(f"#jobs tr[data-job='{job_id}'] input.pick")
    expect(page.locator("#compare-link")).to_have_attribute("data-picked", "2", timeout=0)
    page.click("#compare-link")
    page.locator("#compare[data-charts]").wait_for(timeout=0)
    assert page.url.endswith(f"/compare?jobs={job.id},{second.id}") or page.url.endswith(
        f"/compare?jobs={second.id},{job.id}"
    )
    overlaid = page.locator("#metric-loss polyline")
    assert overlaid.count() == 2  # one line per job
    lengths = sorted(len(line.split()) for line in overlaid.evaluate_all("ls => ls.map(l => l.getAttribute('points'))"))
    assert lengths == sorted([JOB["steps"], SECOND["steps"]])
    screenshot(page, "compare", tmp_path)
    response = page.goto(f"{base}/compare?jobs={job.id},job-that-never-was")
    assert response is not None and response.status == 404
    context.close()


def test_another_tenants_job_answers_404_and_a_suspension_signs_out(server, rival, job, browser):
    context, page = signed_in(browser, rival.dashboard_login().url)
    base = page.url.rstrip("/")
    assert page.locator("#jobs tbody tr").count() == 0  # rival has no jobs; acme's is not listed
    listed = page.goto(base + "/jobs.json")
    assert listed is not None and listed.json() == {"jobs": []}
    for path in (
        f"/jobs/{job.id}",
        f"/jobs/{job.id}/stream",
        f"/jobs/{job.id}/metrics",
        f"/jobs/{job.id}/logs",
        f"/jobs/{job.id}/logs/stream",
        f"/compare?jobs={job.id}",
        "/jobs/job-that-never-was",
        "/admin",
    ):
        response = page.goto(base + path)
        assert response is not None and response.status == 404, path
    with server.admin() as admin:
        admin.suspend_tenant("rival", "test")
    response = page.goto(base + "/")
    assert response is not None and response.status == 401
    context.close()
    fresh = browser.new_context()  # no cookie: nothing but a 401
    response = fresh.new_page().goto(f"{base}/jobs/{job.id}")
    assert response is not None and response.status == 401
    fresh.close()


def test_admin_sees_tenants_queue_and_audit_verdict(server, acme, rival, browser):
    with server.admin() as admin:
        context, page = signed_in(browser, admin.dashboard_login().url)
    assert page.url.endswith("/admin")
    names = page.locator("#tenants tbody tr td:first-child").all_text_contents()
    assert {"acme", "rival"} <= set(names)
    assert page.locator("#audit-verdict").text_content().startswith("intact:")
    context.close()


def test_used_and_expired_links_are_refused_and_audited(server, acme, expired_link, browser):
    login = acme.dashboard_login()
    context, _ = signed_in(browser, login.url)
    context.close()
    again = browser.new_context()
    response = again.new_page().goto(login.url)
    assert response is not None and response.status == 403
    assert not [c for c in again.cookies() if c["name"] == "__Host-cantata_session"]
    wait_for(lambda: dt.datetime.now(dt.UTC) > expired_link.expires, interval=0.5)
    response = again.new_page().goto(expired_link.url)
    assert response is not None and response.status == 403
    again.close()
    with server.admin() as admin:
        records = list(admin.audit_events(tenant="acme", action="dashboard_login"))
    refused = sorted(r.details["reason"] for r in records if r.outcome == "refused")
    assert refused == ["expired", "used"]
    assert sum(r.outcome == "ok" for r in records) >= 2
