"""Fleet's async API client: kubeconfig loading, REST calls, watch and discovery.

Everything that talks to a Fleet (or any Kubernetes) API server goes through
here: kfleet, node agents and controllers alike, so there is one place that
knows the wire conventions.  See `fleet.client.rest.Client`.
"""

from fleet.client.discovery import APIResource, ResourceNotFound, resolve_resource, resource_path
from fleet.client.kubeconfig import (
    ClientConfig,
    KubeconfigError,
    default_data_dir,
    load_kubeconfig,
)
from fleet.client.rest import (
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    TABLE_ACCEPT,
    ApiException,
    Client,
)

__all__ = [
    "APIResource",
    "ApiException",
    "Client",
    "ClientConfig",
    "JSON_PATCH",
    "KubeconfigError",
    "MERGE_PATCH",
    "ResourceNotFound",
    "STRATEGIC_MERGE_PATCH",
    "TABLE_ACCEPT",
    "default_data_dir",
    "load_kubeconfig",
    "resolve_resource",
    "resource_path",
]
