"""Where the control plane's gRPC servers run: grpc's asyncio server on an event loop of its own thread.

Streams run on the loop, so an idle one holds no thread; unary calls are plain
functions that the server runs in the loop's thread pool (which is also where
``asyncio.to_thread`` in a stream sends its blocking steps), or coroutines on
the loop where they do not block.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from concurrent import futures
from typing import Any, TypeVar

import grpc

T = TypeVar("T")


class ServingLoop:
    """An event loop on a thread of its own, with the thread pool for what blocks; ``start()``, then ``stop()``."""

    def __init__(self, threads: int, name: str = "grpc"):
        self.pool = futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"{name}-call")
        self.loop = asyncio.new_event_loop()
        self.loop.set_default_executor(self.pool)
        self._thread = threading.Thread(target=self.loop.run_forever, name=f"{name}-loop", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` on the loop and wait for its result (from any other thread)."""
        return asyncio.run_coroutine_threadsafe(work, self.loop).result()

    def server(
        self, interceptors: Sequence[grpc.aio.ServerInterceptor] = (), options: Sequence[tuple[str, Any]] = ()
    ) -> grpc.aio.Server:
        """A gRPC server on this loop (not started: add handlers and ports, then ``run(server.start())``)."""

        async def build() -> grpc.aio.Server:
            return grpc.aio.server(migration_thread_pool=self.pool, interceptors=interceptors, options=options)

        return self.run(build())

    def stop(self) -> None:
        """Stop the loop and wait for the calls in its pool (stop the servers first)."""
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
        self.pool.shutdown(wait=True)
        self.loop.close()
