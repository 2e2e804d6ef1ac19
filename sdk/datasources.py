"""``client.data_sources``: the tenant's named S3 and Azure Blob credentials (``client.data_sources()`` lists them)."""

from __future__ import annotations

import builtins
from dataclasses import dataclass

from cantata.proto.datasource_rules import credentials_problem, dataset_key_problem
from cantata.proto.v1 import datasources_pb2
from cantata.sdk.errors import InvalidArgument
from cantata.sdk.resource import Resource

DATA_SOURCE_KINDS = {"s3": datasources_pb2.S3, "az": datasources_pb2.AZURE_BLOB}
DATA_SOURCE_KIND_NAMES = {value: name for name, value in DATA_SOURCE_KINDS.items()}


@dataclass(frozen=True)
class DataSource:
    """A registered data source as its tenant sees it: never its secrets."""

    name: str
    kind: str
    endpoint: str
    has_dataset_key: bool
    created: str

    @classmethod
    def from_proto(cls, info: datasources_pb2.DataSourceInfo) -> DataSource:
        return cls(
            info.name,
            DATA_SOURCE_KIND_NAMES[info.kind],
            info.endpoint,
            info.has_dataset_key,
            info.created.ToJsonString(),
        )


def data_source_request(
    name: str, kind: str, endpoint: str, credentials: dict[str, str], dataset_key: bytes | None, replace: bool
) -> datasources_pb2.RegisterDataSourceRequest:
    """A registration request, refusing what is wrong before it is sent (the server checks it all again)."""
    refused = credentials_problem(kind, credentials) or dataset_key_problem(dataset_key)
    if refused:
        raise InvalidArgument(refused)
    field, message = (
        ("s3", datasources_pb2.S3Credentials) if kind == "s3" else ("azure", datasources_pb2.AzureCredentials)
    )
    return datasources_pb2.RegisterDataSourceRequest(
        name=name,
        kind=DATA_SOURCE_KINDS[kind],
        endpoint=endpoint,
        dataset_key=dataset_key or b"",
        replace=replace,
        **{field: message(**credentials)},
    )


class DataSources(Resource):
    """``client.data_sources``: calling it lists them (never their secrets)."""

    def __call__(self) -> builtins.list[DataSource]:
        return self.list()

    def register(
        self,
        name: str,
        *,
        kind: str,
        endpoint: str = "",
        credentials: dict[str, str],
        dataset_key: bytes | None = None,
        replace: bool = False,
    ) -> DataSource:
        """Register S3 (``kind="s3"``) or Azure Blob (``"az"``) credentials under ``name`` for this tenant's jobs.

        ``credentials`` holds S3's ``access_key_id``, ``secret_access_key`` and
        optional ``session_token`` and ``region``, or Azure's
        ``connection_string``, or ``account_name`` with ``account_key``, or
        ``sas_token``. ``dataset_key`` (the tenant's 32-byte key) lets the
        jobs' workers read shards uploaded encrypted. An existing name is a
        ``Conflict`` unless ``replace``.
        """
        request = data_source_request(name, kind, endpoint, credentials, dataset_key, replace)
        return DataSource.from_proto(self._call(self._client._data_sources.RegisterDataSource, request))

    def list(self) -> builtins.list[DataSource]:
        reply = self._call(self._client._data_sources.ListDataSources, datasources_pb2.ListDataSourcesRequest())
        return [DataSource.from_proto(s) for s in reply.sources]

    def delete(self, name: str) -> None:
        self._call(self._client._data_sources.DeleteDataSource, datasources_pb2.DeleteDataSourceRequest(name=name))
