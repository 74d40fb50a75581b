"""Images on a node: the content-addressed store, registry pulls, archive import, pull policy.

The agent uses this package through a handful of names:

    store = await ImageStore.open(data_dir / "images")
    creds = credentials_for(parse_reference(image).domain, pull_secret_configs)
    record = await pull(store, image, policy=container.get("imagePullPolicy"), auth=creds,
                        insecure_registries=node_config.insecure_registries,
                        registries=node_config.registries)   # mirrors, per-host auth/TLS
    lowerdirs = await store.layers_for(image)      # bottom layer first
    config = await store.image_config(image)       # Env, Cmd, Entrypoint, WorkingDir, User
    freed = await store.gc(keep=images_in_use, bytes_to_free=n)

Failures to get an image raise `ImagePullError(reason, message)`.
"""

from fleet.runtime.images.archive import import_archive, import_archive_sync
from fleet.runtime.images.auth import Credentials, credentials_for, parse_challenges
from fleet.runtime.images.errors import (
    ERR_IMAGE_NEVER_PULL,
    ERR_IMAGE_PULL,
    INVALID_IMAGE_NAME,
    DigestMismatchError,
    ImageError,
    ImageImportError,
    ImageNotFoundError,
    ImagePullError,
    LayerError,
)
from fleet.runtime.images.layers import flatten_layers
from fleet.runtime.images.manifest import Platform, select_platform
from fleet.runtime.images.mirrors import (
    Endpoint,
    RegistriesConfig,
    RegistriesConfigError,
    endpoints_for,
    is_insecure,
    load_registries,
    parse_registries,
    parse_registries_yaml,
)
from fleet.runtime.images.policy import default_pull_policy, should_pull
from fleet.runtime.images.reference import Reference, normalize, parse_reference
from fleet.runtime.images.registry import RegistryClient, pull
from fleet.runtime.images.store import ImageRecord, ImageStore, LayerRecord, plan_gc

__all__ = [
    "ERR_IMAGE_NEVER_PULL",
    "ERR_IMAGE_PULL",
    "INVALID_IMAGE_NAME",
    "Credentials",
    "DigestMismatchError",
    "Endpoint",
    "ImageError",
    "ImageImportError",
    "ImageNotFoundError",
    "ImagePullError",
    "ImageRecord",
    "ImageStore",
    "LayerError",
    "LayerRecord",
    "Platform",
    "Reference",
    "RegistriesConfig",
    "RegistriesConfigError",
    "RegistryClient",
    "credentials_for",
    "default_pull_policy",
    "endpoints_for",
    "flatten_layers",
    "import_archive",
    "import_archive_sync",
    "is_insecure",
    "load_registries",
    "normalize",
    "parse_challenges",
    "parse_registries",
    "parse_registries_yaml",
    "parse_reference",
    "plan_gc",
    "pull",
    "select_platform",
    "should_pull",
]
