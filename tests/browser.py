"""Debian's chromium driven by Playwright, for the dashboard's browser tests (Playwright downloads nothing).

The docs' screenshots: with CANTATA_DASHBOARD_SCREENSHOTS=docs/images, the tests that call :func:`screenshot`
write ``dashboard-NAME.png`` there; otherwise under the test's temp dir.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright

CHROMIUM = "/usr/bin/chromium"  # Debian's package (make test installs it)
SCREENSHOT_ENV = "CANTATA_DASHBOARD_SCREENSHOTS"


def _spki_pin(certificate_pem: bytes) -> str:
    spki = (
        x509.load_pem_x509_certificate(certificate_pem)
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


@contextmanager
def chromium(server_certificate: Path) -> Iterator[Browser]:
    """A headless chromium that trusts exactly the server certificate at ``server_certificate`` (by its key)."""
    pin = _spki_pin(server_certificate.read_bytes())
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--ignore-certificate-errors-spki-list={pin}",
            ],
        )
        yield browser
        browser.close()


def signed_in(browser: Browser, url: str) -> tuple[BrowserContext, Page]:
    """A fresh browser context (its own cookies) that redeemed the login link ``url``; returns (context, page)."""
    context = browser.new_context(viewport={"width": 1200, "height": 1000})
    page = context.new_page()
    response = page.goto(url)
    assert response is not None and response.ok, response and response.status
    return context, page


def screenshot(page: Page, name: str, tmp_path: Path) -> None:
    """Save the whole page as ``dashboard-NAME.png`` (see the module's docstring for where)."""
    path = Path(os.environ.get(SCREENSHOT_ENV) or tmp_path) / f"dashboard-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 0
