"""Registry mirrors, rewrites, credentials and TLS per registry host: a node's `registries.yaml`.

This module owns the node's answer to "where do I fetch this image from, and
how?".  The file has k3s' format (what containerd's hosts configuration is
generated from there), so a site's existing file works unchanged:

    mirrors:
      docker.io:                          # a registry name, or "*" for every registry
        endpoint:                         # tried in order
          - "http://127.0.0.1:5000"
          - "https://mirror.example.com"  # a path other than /v2 is the API root as given
        rewrite:                          # regex → replacement on the repository path,
          "^library/(.*)": "mirror/$1"    #   for mirror endpoints only (Go's $1 syntax)
    configs:
      mirror.example.com:                 # a registry or mirror host[:port], or "*"
        auth: {username: u, password: p}  # or auth: base64(u:p), or identity_token
        tls: {ca_file: ..., cert_file: ..., key_file: ..., insecure_skip_verify: false}

Semantics follow k3s' documentation and containerd's hosts rules:

- An image's endpoints are its registry's mirror endpoints in order (the `"*"`
  entry when the registry has none of its own), then the registry itself — the
  *default endpoint* (`registry-1.docker.io` for `docker.io`) — unless the node
  runs with the default endpoint disabled.  Rewrites never apply to the default
  endpoint; the image is recorded under its original name either way.
- Transport: a mirror endpoint uses the scheme its URL says (`https://` when it
  says none); plain HTTP only for an `http://` URL or a host named with
  `--insecure-registry`.  The default endpoint keeps Docker's rule (HTTPS, with
  the HTTP fall-back only for loopback or insecure-named registries).
- `configs` are looked up by the host an endpoint talks to (mirror host, or the
  registry's own name for the default endpoint), then `"*"`.

Parsing (`parse_registries`, `parse_registries_yaml`) and resolution
(`endpoints_for`) are pure: no file or network access, so both are table-tested.
`load_registries` is the one function that reads files: the YAML itself and,
to fail at start rather than at the first pull, a check that the TLS files exist.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from fleet.api import images as _images
from fleet.api.images import DOCKER_HUB, Reference
from fleet.runtime.images.auth import Credentials
from fleet.runtime.images.errors import ERR_IMAGE_PULL, ImagePullError
from fleet.runtime.images.reference import parse_reference

WILDCARD = "*"
# The registry names Docker Hub answers to; a mirror or config key written with any of
# them means docker.io (what image references normalize to).
_HUB_ALIASES = {"docker.io", "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com"}
_DEFAULT_PORTS = {"https": "443", "http": "80"}


class RegistriesConfigError(ValueError):
    """The registries file is malformed; the message names the file and the bad field."""


@dataclass(frozen=True)
class TLSConfig:
    """How to talk TLS to one host (k3s' `configs.<host>.tls`)."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    insecure_skip_verify: bool = False

    def files(self) -> list[tuple[str, str]]:
        """(field, path) of every file named, for the start-up existence check."""
        return [(n, p) for n, p in (("ca_file", self.ca_file), ("cert_file", self.cert_file),
                                    ("key_file", self.key_file)) if p]


@dataclass(frozen=True)
class HostConfig:
    """Credentials and TLS settings for one registry or mirror host."""

    auth: Credentials | None = None
    tls: TLSConfig | None = None


@dataclass(frozen=True)
class Rewrite:
    """One `rewrite` rule: a compiled pattern and its replacement in Go's `$1` syntax."""

    pattern: re.Pattern[str]
    replacement: str

    def apply(self, path: str) -> str:
        """`path` with every match replaced (Go's Regexp.ReplaceAllString)."""
        return self.pattern.sub(lambda m: _expand(self.replacement, m), path)


@dataclass(frozen=True)
class Mirror:
    """A registry's mirror list: endpoint URLs (normalized) and rewrite rules, in file order."""

    endpoints: tuple[str, ...] = ()
    rewrites: tuple[Rewrite, ...] = ()


@dataclass(frozen=True)
class RegistriesConfig:
    """A parsed registries file, plus the node's switch for the default-endpoint fall-back."""

    mirrors: Mapping[str, Mirror] = field(default_factory=dict)
    configs: Mapping[str, HostConfig] = field(default_factory=dict)
    # k3s' --disable-default-registry-endpoint: pull only from mirrors for registries
    # that have some (a registry without mirrors still uses its own endpoint).
    disable_default_endpoint: bool = False
    source: str = ""


@dataclass(frozen=True)
class Endpoint:
    """One place to pull an image from, in the order `endpoints_for` returns them.

    `url` is the distribution API root (`https://host/v2`, or a mirror's own path);
    requests go to `{url}/{repository}/manifests/...`.
    """

    url: str
    host: str
    repository: str
    mirror: bool
    credentials: Credentials | None = None
    tls: TLSConfig | None = None
    # HTTPS first without certificate checks, then plain HTTP (Docker's insecure rule).
    plain_http_fallback: bool = False

    def describe(self) -> str:
        """How errors name this endpoint: `mirror http://h:5000/v2` or `registry h`."""
        return f"mirror {self.url}" if self.mirror else f"registry {self.host}"


# ---------------------------------------------------------------------------------------
# Parsing (pure)


def parse_registries_yaml(text: str, *, source: str = "registries.yaml",
                          disable_default_endpoint: bool = False) -> RegistriesConfig:
    """Parse the YAML text of a registries file; raises RegistriesConfigError."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise RegistriesConfigError(f"{source}: not valid YAML: {e}") from None
    return parse_registries(doc, source=source, disable_default_endpoint=disable_default_endpoint)


def parse_registries(doc: Any, *, source: str = "registries.yaml",
                     disable_default_endpoint: bool = False) -> RegistriesConfig:
    """Validate a decoded registries document; raises RegistriesConfigError naming the field."""
    if doc is None:
        doc = {}
    top = _mapping(doc, source, "the top level")
    _only(top, ("mirrors", "configs"), source, "")
    mirrors: dict[str, Mirror] = {}
    for key, value in _mapping(top.get("mirrors") or {}, source, "mirrors").items():
        where = f"mirrors[{key!r}]"
        name = _registry_key(key, source, where)
        if name in mirrors:
            raise RegistriesConfigError(f"{source}: {where}: {name} is listed twice")
        mirrors[name] = _parse_mirror(value, source, where)
    configs: dict[str, HostConfig] = {}
    for key, value in _mapping(top.get("configs") or {}, source, "configs").items():
        where = f"configs[{key!r}]"
        name = _registry_key(key, source, where)
        if name in configs:
            raise RegistriesConfigError(f"{source}: {where}: {name} is listed twice")
        configs[name] = _parse_host_config(value, source, where)
    return RegistriesConfig(mirrors=mirrors, configs=configs,
                            disable_default_endpoint=disable_default_endpoint, source=source)


def _parse_mirror(value: Any, source: str, where: str) -> Mirror:
    m = _mapping(value if value is not None else {}, source, where)
    _only(m, ("endpoint", "rewrite"), source, where)
    raw = m.get("endpoint") or []
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        raise RegistriesConfigError(f"{source}: {where}.endpoint: must be a list of URLs")
    endpoints = []
    for i, url in enumerate(raw):
        endpoints.append(normalize_endpoint(url, source, f"{where}.endpoint[{i}]"))
    rewrites = []
    for pattern, repl in _mapping(m.get("rewrite") or {}, source, f"{where}.rewrite").items():
        at = f"{where}.rewrite[{pattern!r}]"
        if not isinstance(pattern, str) or not isinstance(repl, str):
            raise RegistriesConfigError(f"{source}: {at}: pattern and replacement must be strings")
        try:
            compiled = re.compile(pattern)
        except re.error as e:
            raise RegistriesConfigError(f"{source}: {at}: bad regular expression: {e}") from None
        bad = _bad_group_reference(repl, compiled)
        if bad:
            raise RegistriesConfigError(f"{source}: {at}: replacement refers to {bad}, "
                                        "which the pattern does not have")
        rewrites.append(Rewrite(compiled, repl))
    return Mirror(tuple(endpoints), tuple(rewrites))


def normalize_endpoint(url: Any, source: str = "registries.yaml", where: str = "endpoint") -> str:
    """An endpoint as its API root URL: scheme (https by default), host[:port], path.

    k3s' rule: no path, `/` or `/v2` means the standard `/v2` root; any other path
    is used as given (containerd's `override_path`), for registries that serve
    a mirror under a prefix.  Default ports are dropped so `configs` keys match.
    """
    if not isinstance(url, str) or not url.strip():
        raise RegistriesConfigError(f"{source}: {where}: must be a URL string")
    text = url.strip()
    if "://" not in text:
        text = "https://" + text
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as e:
        raise RegistriesConfigError(f"{source}: {where}: {url!r} is not a URL: {e}") from None
    if parts.scheme not in ("http", "https"):
        raise RegistriesConfigError(f"{source}: {where}: {url!r}: the scheme must be http or https")
    if not parts.hostname:
        raise RegistriesConfigError(f"{source}: {where}: {url!r} has no host")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise RegistriesConfigError(
            f"{source}: {where}: {url!r}: no query, fragment or user info (credentials go "
            "under configs.<host>.auth)")
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    if port is not None and str(port) != _DEFAULT_PORTS[parts.scheme]:
        host = f"{host}:{port}"
    path = parts.path.rstrip("/")
    if path in ("", "/v2"):
        path = "/v2"
    return f"{parts.scheme}://{host.lower()}{path}"


def _registry_key(key: Any, source: str, where: str) -> str:
    """A mirrors/configs key as a registry name: host[:port] lower-cased, Hub aliases → docker.io."""
    if not isinstance(key, str) or not key.strip():
        raise RegistriesConfigError(f"{source}: {where}: the key must be a registry host name")
    name = key.strip().lower()
    if name == WILDCARD:
        return name
    if "://" in name or "/" in name:
        raise RegistriesConfigError(
            f"{source}: {where}: {key!r} is a URL or path; the key is a registry host[:port] "
            "(endpoint URLs go in the endpoint list)")
    if name in _HUB_ALIASES:
        return DOCKER_HUB
    # The one reference parser decides what a registry host is: a name with a dot or a
    # port, or localhost (anything else would be read as a Docker Hub path).
    try:
        parsed = _images.parse_reference(f"{name}/x")
    except _images.InvalidReference:
        parsed = None
    if parsed is None or parsed.domain != name:
        raise RegistriesConfigError(
            f"{source}: {where}: {key!r} is not a registry host (a name with a dot or a port, "
            "or localhost, or \"*\")")
    return name


def _parse_host_config(value: Any, source: str, where: str) -> HostConfig:
    m = _mapping(value if value is not None else {}, source, where)
    _only(m, ("auth", "tls"), source, where)
    auth = None
    if m.get("auth") is not None:
        auth = _parse_auth(m["auth"], source, f"{where}.auth")
    tls = None
    if m.get("tls") is not None:
        t = _mapping(m["tls"], source, f"{where}.tls")
        _only(t, ("ca_file", "cert_file", "key_file", "insecure_skip_verify"), source, f"{where}.tls")
        files = {}
        for name in ("ca_file", "cert_file", "key_file"):
            v = t.get(name) or ""
            if not isinstance(v, str):
                raise RegistriesConfigError(f"{source}: {where}.tls.{name}: must be a file path")
            files[name] = v
        skip = t.get("insecure_skip_verify", False)
        if not isinstance(skip, bool):
            raise RegistriesConfigError(f"{source}: {where}.tls.insecure_skip_verify: must be true "
                                        "or false")
        if files["key_file"] and not files["cert_file"]:
            raise RegistriesConfigError(f"{source}: {where}.tls.key_file: needs cert_file too")
        tls = TLSConfig(insecure_skip_verify=skip, **files)
    return HostConfig(auth=auth, tls=tls)


def _parse_auth(value: Any, source: str, where: str) -> Credentials:
    a = _mapping(value, source, where)
    _only(a, ("username", "password", "auth", "identity_token"), source, where)
    for name, v in a.items():
        if v is not None and not isinstance(v, str):
            raise RegistriesConfigError(f"{source}: {where}.{name}: must be a string")
    user, password = a.get("username") or "", a.get("password") or ""
    token = a.get("identity_token") or ""
    if a.get("auth"):
        if user or password:
            raise RegistriesConfigError(f"{source}: {where}.auth: give either auth or "
                                        "username/password, not both")
        try:
            decoded = base64.b64decode(a["auth"], validate=True).decode()
        except (binascii.Error, ValueError, UnicodeDecodeError):
            raise RegistriesConfigError(f"{source}: {where}.auth: not base64 of "
                                        "\"username:password\"") from None
        user, sep, password = decoded.partition(":")
        if not sep:
            raise RegistriesConfigError(f"{source}: {where}.auth: the decoded value has no ':' "
                                        "between username and password")
    if not (user or password or token):
        raise RegistriesConfigError(f"{source}: {where}: needs username/password, auth or "
                                    "identity_token")
    return Credentials(user, password, identity_token=token)


def _mapping(value: Any, source: str, where: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise RegistriesConfigError(f"{source}: {where}: must be a mapping, not "
                                    f"{type(value).__name__}")
    return value


def _only(m: Mapping[Any, Any], allowed: tuple[str, ...], source: str, where: str) -> None:
    # Unknown keys are refused, not ignored: a typo (`endpoints:`, `ca-file:`) would
    # otherwise silently send pulls to the internet or skip a CA.
    for k in m:
        if k not in allowed:
            at = f"{where}.{k}" if where else str(k)
            raise RegistriesConfigError(f"{source}: {at}: unknown field (expected one of "
                                        f"{', '.join(allowed)})")


# Go's regexp.Expand: $1, ${1}, $name, ${name}; $$ is a literal $.
_GO_GROUP = re.compile(r"\$(?:\$|\{([A-Za-z0-9_]+)\}|([A-Za-z0-9_]+))")


def _expand(template: str, m: re.Match[str]) -> str:
    def one(g: re.Match[str]) -> str:
        if g.group(0) == "$$":
            return "$"
        name = g.group(1) or g.group(2)
        try:
            value = m.group(int(name)) if name.isdigit() else m.group(name)
        except IndexError:
            value = None  # Go expands an unknown group to the empty string
        return value or ""
    return _GO_GROUP.sub(one, template)


def _bad_group_reference(template: str, pattern: re.Pattern[str]) -> str | None:
    """The first `$n`/`$name` in `template` that `pattern` has no group for, if any."""
    for g in _GO_GROUP.finditer(template):
        name = g.group(1) or g.group(2)
        if name is None:
            continue
        if name.isdigit():
            if int(name) > pattern.groups:
                return f"${name}"
        elif name not in pattern.groupindex:
            return f"${{{name}}}"
    return None


# ---------------------------------------------------------------------------------------
# Loading (the one function here that touches files)


def load_registries(path: Path | str, *, disable_default_endpoint: bool = False) -> RegistriesConfig:
    """Read and validate a registries file, checking that the TLS files it names exist."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise RegistriesConfigError(f"{p}: cannot read: {e.strerror or e}") from None
    cfg = parse_registries_yaml(text, source=str(p), disable_default_endpoint=disable_default_endpoint)
    for host, hc in cfg.configs.items():
        for name, file in hc.tls.files() if hc.tls else []:
            if not Path(file).is_file():
                raise RegistriesConfigError(f"{p}: configs[{host!r}].tls.{name}: {file}: no such file")
    return cfg


# ---------------------------------------------------------------------------------------
# Resolution (pure)


def endpoints_for(image_ref: Reference | str, config: RegistriesConfig | None, *,
                  insecure_registries: Iterable[str] = ()) -> list[Endpoint]:
    """Where to pull `image_ref` from, in order: mirror endpoints, then the registry itself.

    Raises ImagePullError(InvalidImageName) for a malformed reference, and
    ImagePullError(ErrImagePull) when a rewrite turns the name into no valid
    repository (the message names the rule).
    """
    ref = parse_reference(image_ref) if isinstance(image_ref, str) else image_ref
    cfg = config or RegistriesConfig()
    insecure = tuple(insecure_registries)
    out: list[Endpoint] = []
    mirror = cfg.mirrors.get(ref.domain) or cfg.mirrors.get(WILDCARD)
    default_url = f"https://{ref.registry_host}/v2"
    for url in mirror.endpoints if mirror else ():
        host = url.split("://", 1)[1].split("/", 1)[0]
        if url == default_url:
            continue  # the registry itself, listed as a mirror: it comes last, unrewritten
        # A configs key may spell out the default port the URL left implicit.
        port = _DEFAULT_PORTS[url.split("://", 1)[0]]
        has_port = ":" in host.rsplit("]", 1)[-1]
        hc = _host_config(cfg, (host,) if has_port else (host, f"{host}:{port}"))
        named_insecure = is_insecure_named(host, insecure)
        out.append(Endpoint(
            url=url, host=host, repository=_rewritten(ref, mirror, cfg.source), mirror=True,
            credentials=hc.auth, tls=hc.tls,
            plain_http_fallback=named_insecure and url.startswith("https://")))
    if not (out and cfg.disable_default_endpoint):
        names = (ref.domain, ref.registry_host) if ref.domain != DOCKER_HUB else (
            DOCKER_HUB, ref.registry_host, "index.docker.io")
        hc = _host_config(cfg, names)
        out.append(Endpoint(
            url=default_url, host=ref.registry_host, repository=ref.path, mirror=False,
            credentials=hc.auth, tls=hc.tls,
            plain_http_fallback=is_insecure(ref.registry_host, insecure)))
    return out


def is_loopback_host(host: str) -> bool:
    """True for `localhost`, 127.0.0.0/8 and ::1 (with or without a port)."""
    h = host
    if h.startswith("["):
        h = h[1:].split("]", 1)[0]
    elif h.count(":") == 1:
        h = h.split(":", 1)[0]
    if h.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def is_insecure(host: str, insecure_registries: Iterable[str]) -> bool:
    """Whether plain HTTP may be used for a registry's own endpoint `host` (Docker's rule).

    Loopback, or listed: `host[:port]`, the bare host, or a CIDR holding it.
    """
    return is_loopback_host(host) or is_insecure_named(host, insecure_registries)


def is_insecure_named(host: str, insecure_registries: Iterable[str]) -> bool:
    """Whether `host` is listed as insecure: `host[:port]`, its bare host, or a CIDR holding it.

    Unlike Docker's rule for a registry's own endpoint, loopback alone does not make a
    mirror insecure: its URL says http:// when it is.
    """
    bare = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    bare = bare.strip("[]")
    for entry in insecure_registries:
        e = entry.strip().lower().split("://", 1)[-1].rstrip("/")
        if e in (host.lower(), bare.lower()):
            return True
        if "/" in e:
            try:
                if ipaddress.ip_address(bare) in ipaddress.ip_network(e, strict=False):
                    return True
            except ValueError:
                continue
    return False


def _host_config(cfg: RegistriesConfig, names: tuple[str, ...]) -> HostConfig:
    for n in names:
        hc = cfg.configs.get(n.lower())
        if hc is not None:
            return hc
    return cfg.configs.get(WILDCARD) or HostConfig()


def _rewritten(ref: Reference, mirror: Mirror, source: str) -> str:
    """The repository path at a mirror: the first rule that changes it wins (file order)."""
    for rule in mirror.rewrites:
        new = rule.apply(ref.path)
        if new == ref.path:
            continue
        try:
            # The one reference parser judges the result (any registry host will do here).
            _images.parse_reference(f"mirror.invalid/{new}")
        except _images.InvalidReference:
            raise ImagePullError(
                ERR_IMAGE_PULL,
                f'{source or "registries"}: rewrite {rule.pattern.pattern!r} turns "{ref.path}" '
                f'into "{new}", which is not a repository name') from None
        return new
    return ref.path
