"""DataSources: a tenant registers, lists and deletes its named S3 / Azure credentials.

Only tenants call it (the authorization table says so); every name is looked
up within the caller's tenant, so another tenant's source is ``NOT_FOUND``
like a missing one. Secrets go into the :class:`DataSourceStore` and never
into a reply, the audit log or a log line.
"""

from __future__ import annotations

from cantata.proto.v1 import datasources_pb2, datasources_pb2_grpc
from cantata.security.audit import Action
from cantata.server.auth import caller
from cantata.server.datasource_store import (
    DataSourceRecord,
    DataSourceSpec,
    DataSourceStore,
    InvalidDataSource,
)

KIND_NAMES = {datasources_pb2.S3: "s3", datasources_pb2.AZURE_BLOB: "az"}
KIND_VALUES = {name: value for value, name in KIND_NAMES.items()}
CREDENTIALS_OF_KIND = {"s3": "s3", "az": "azure"}


def parse_registration(request: datasources_pb2.RegisterDataSourceRequest) -> DataSourceSpec:
    """The validated spec of a registration request (``InvalidDataSource`` names the bad field)."""
    kind = KIND_NAMES.get(request.kind)
    if kind is None:
        raise InvalidDataSource("kind: S3 or AZURE_BLOB is required")
    if request.WhichOneof("credentials") != CREDENTIALS_OF_KIND[kind]:
        raise InvalidDataSource(f"credentials: a {kind} source needs {CREDENTIALS_OF_KIND[kind]} credentials")
    message = request.s3 if kind == "s3" else request.azure
    secrets = {descriptor.name: value for descriptor, value in message.ListFields() if value}
    return DataSourceSpec(request.name, kind, request.endpoint, secrets, request.dataset_key or None)


def _info(record: DataSourceRecord) -> datasources_pb2.DataSourceInfo:
    info = datasources_pb2.DataSourceInfo(
        name=record.name,
        kind=KIND_VALUES[record.kind],
        endpoint=record.endpoint,
        has_dataset_key=record.has_dataset_key,
    )
    info.created.FromJsonString(record.created_at.replace("+00:00", "Z"))
    return info


class DataSourcesService(datasources_pb2_grpc.DataSourcesServicer):
    def __init__(self, sources: DataSourceStore, audit):
        self._sources = sources
        self._audit = audit

    def RegisterDataSource(self, request, context):
        me = caller(context)
        spec = parse_registration(request)
        with self._sources.database.transaction():  # registered only once its record is durable
            record = self._sources.register(me.name, spec, replace=request.replace)
            self._audit(
                me.uri,
                Action.DATA_SOURCE_REGISTERED,
                resource=record.name,
                tenant=me.name,
                peer=context.peer(),
                details={"kind": record.kind, "endpoint": record.endpoint, "replace": request.replace},
            )
        return _info(record)

    def ListDataSources(self, request, context):
        return datasources_pb2.ListDataSourcesReply(
            sources=[_info(r) for r in self._sources.sources(caller(context).name)]
        )

    def DeleteDataSource(self, request, context):
        me = caller(context)
        with self._sources.database.transaction():  # deleted only once its record is durable
            self._sources.delete(me.name, request.name)
            self._audit(me.uri, Action.DATA_SOURCE_DELETED, resource=request.name, tenant=me.name, peer=context.peer())
        return datasources_pb2.DeleteDataSourceReply()
