"""gRPC health checking: grpc's asyncio servicer, with ``Check`` as a plain function like every unary call here."""

from __future__ import annotations

from grpc_health.v1 import health, health_pb2

from cantata.server.store import NotFound


class HealthService(health.aio.HealthServicer):
    """``Watch`` waits on the event loop (no thread per watcher); ``Check`` runs in the thread pool."""

    def Check(self, request, context):
        status = self._server_status.get(request.service)
        if status is None:
            raise NotFound(f"no service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    def List(self, request, context):
        """Every service's status (the aio servicer leaves this method unimplemented)."""
        return health_pb2.HealthListResponse(
            statuses={name: health_pb2.HealthCheckResponse(status=s) for name, s in self._server_status.items()}
        )
