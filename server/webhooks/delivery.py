"""The deliverer: POSTs each due webhook delivery, signed, and retries failures with backoff.

One thread takes due deliveries from the outbox (:class:`~cantata.server.webhooks.store.WebhookStore`)
and hands them to a small pool, so a slow receiver holds one slot, never the
others. An attempt resolves the endpoint's host, checks every address against
the :class:`~cantata.server.webhooks.targets.AddressPolicy` and connects to the
checked ones in turn until one accepts (TLS still verifies the host name,
against the system's CAs or ``ca_file``), without following redirects, within
``timeout_s``. A 2xx answer
delivers; anything else is retried after ``backoff_s`` doubled per attempt (at
most ``backoff_max_s``), half of it random jitter, until ``max_attempts`` have
failed: then the delivery is dead, and the tenant sees it with its last error.

Each request carries ``Cantata-Signature: t=UNIX,v1=HEX``: the HMAC-SHA256,
under the endpoint's secret, of the UNIX time, a dot and the body (receivers
check it with ``cantata.sdk.webhooks.verify_signature``). Secrets and URLs
never reach a log line: deliveries are logged by id and webhook id.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import random
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import urllib3

from cantata.server.webhooks.store import DueDelivery, WebhookStore
from cantata.server.webhooks.targets import AddressPolicy, InvalidWebhook, Target, parse_url

log = logging.getLogger(__name__)

USER_AGENT = "Cantata-Webhooks/1"
IDLE_WAIT_S = 60.0  # the longest the deliverer sleeps with nothing due (a wake-up comes sooner)


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The ``Cantata-Signature`` header value of ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


class WebhookDeliverer:
    """Delivers the store's due deliveries on ``concurrency`` threads until :meth:`shutdown`."""

    def __init__(
        self,
        store: WebhookStore,
        policy: AddressPolicy,
        *,
        ca_file: str = "",
        timeout_s: float = 10.0,
        max_attempts: int = 8,
        backoff_s: float = 5.0,
        backoff_max_s: float = 3600.0,
        concurrency: int = 4,
    ):
        self._store = store
        self._policy = policy
        self._tls = ssl.create_default_context(cafile=ca_file or None)
        self._timeout = urllib3.Timeout(total=timeout_s)
        self._max_attempts = max_attempts
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s
        self._concurrency = concurrency
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="webhook")
        self._busy: set[int] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="webhooks", daemon=True)
        store.on_enqueued = self.wake

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """Look for due deliveries now (a new one was queued, or one finished). Thread-safe."""
        self._wake.set()

    def shutdown(self, wait: float = 5.0) -> None:
        """Stop taking deliveries; attempts in flight end within their timeout (left pending if cut off)."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(wait)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            wait = IDLE_WAIT_S
            try:
                with self._lock:
                    busy = set(self._busy)
                room = 2 * self._concurrency - len(busy)  # queued in the pool beyond its threads: a few
                if room > 0:  # else a finishing attempt wakes this thread
                    for delivery in self._store.due(time.time(), room, busy):
                        with self._lock:
                            self._busy.add(delivery.id)
                        busy.add(delivery.id)
                        self._pool.submit(self._deliver, delivery)
                    due = self._store.next_due(busy)
                    if due is not None:
                        wait = max(0.0, min(wait, due - time.time()))
            except Exception:  # the database failed: try again later
                log.exception("webhook deliveries could not be read")
                wait = 5.0
            self._wake.wait(wait)
            self._wake.clear()

    def _deliver(self, delivery: DueDelivery) -> None:
        attempt, started = delivery.attempts + 1, time.monotonic()
        status, error = 0, ""
        try:
            target = parse_url(delivery.url)
            addresses = self._policy.resolve(target)
            for n, address in enumerate(addresses, 1):
                try:
                    status = self._post(target, address, delivery)
                    break
                except urllib3.exceptions.NewConnectionError:  # refused or unreachable: the host's next address
                    if n == len(addresses):
                        raise
            if not 200 <= status < 300:
                error = f"HTTP {status}"
        except InvalidWebhook as refused:
            error = str(refused)
        except (urllib3.exceptions.HTTPError, OSError) as failed:
            error = f"{type(failed).__name__}: {failed}"[:500]
        except Exception as failed:  # an attempt's failure is recorded, never the deliverer's end
            log.exception("webhook delivery %d failed unexpectedly", delivery.id)
            error = f"{type(failed).__name__}: {failed}"[:500]
        retry_at = None
        if error and attempt < self._max_attempts:
            delay = min(self._backoff_max_s, self._backoff_s * 2 ** (attempt - 1))
            retry_at = time.time() + delay / 2 + random.uniform(0, delay / 2)
        try:
            state = self._store.record_attempt(
                delivery.id,
                attempt,
                status=status,
                error=error,
                seconds=time.monotonic() - started,
                retry_at=retry_at,
            )
            log.info(
                "webhook delivery %d (%s, %s) attempt %d: %s%s",
                delivery.id,
                delivery.webhook_id,
                delivery.event_type,
                attempt,
                state,
                f" ({error})" if error else "",
            )
        except Exception:  # left pending as it was: the next pass tries it again
            log.exception("webhook delivery %d: its attempt could not be recorded", delivery.id)
        finally:
            with self._lock:
                self._busy.discard(delivery.id)
            self.wake()

    def _post(self, target: Target, address: str, delivery: DueDelivery) -> int:
        """POST the delivery to ``address`` (``target``'s host, checked); returns the HTTP status."""
        host = f"[{target.host}]" if ":" in target.host else target.host  # an IPv6 literal
        host_header = host if target.port == 443 else f"{host}:{target.port}"
        headers = {
            "Host": host_header,
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "Cantata-Event-Id": delivery.event_id,
            "Cantata-Event-Type": delivery.event_type,
            "Cantata-Delivery": str(delivery.id),
            "Cantata-Signature": signature(delivery.secret, int(time.time()), delivery.body),
        }
        pool = urllib3.HTTPSConnectionPool(
            address,
            target.port,
            ssl_context=self._tls,
            server_hostname=target.host,
            assert_hostname=target.host,
            timeout=self._timeout,
            retries=False,
            maxsize=1,
        )
        try:
            response = pool.urlopen(
                "POST",
                target.path,
                body=delivery.body,
                headers=headers,
                redirect=False,
                retries=False,
                preload_content=False,
                assert_same_host=False,
            )
            response.release_conn()
            return response.status
        finally:
            pool.close()
