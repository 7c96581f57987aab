"""Building kubernetes-asyncio clients from kubeconfig files, with the library's errors mapped.

Owns: `api_client` (an ApiClient for one kubeconfig context, or the pod's service account in a
cluster), `KubeError`, the one exception type callers outside `gpufed.kube` see,
`require_kubeconfig`, the one "does this kubeconfig file exist" check every command makes before
it connects (its `KubeconfigError` is a KubeError), and `load_kubeconfig`, which reads one file or
a KUBECONFIG-style list merged as kubectl merges it. Does not decide which kubeconfig a command
uses (the CLI does, as kubectl does) and does not retry or rate-limit (later layers do).

A kubeconfig path may name several files joined by `os.pathsep` (`a:b`, as in KUBECONFIG). The
client library merges such a list itself, first file wins for each named cluster, context and user
as in kubectl, but takes the *last* file's current-context; so for a list the context is resolved
here (first file that sets current-context wins) and handed to the library by name.

A kubeconfig is checked (`check_kubeconfig`) before the client library reads it: the library
answers a malformed one with KeyError, TypeError, AttributeError or a bare `assert`; we answer
with KubeError naming the field (`users[0].user.client-key-data is not valid base64`).

Every client's HTTP session ignores the environment (`_without_env`: no netrc read or proxy lookup
per request); a kubeconfig's own `proxy-url` still applies.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import tempfile
import weakref
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from gpufed.errors import GpufedError
from gpufed.kube import library

library.load()  # before the first import of kubernetes_asyncio: see gpufed.kube.library

from kubernetes_asyncio import client, config  # noqa: E402
from kubernetes_asyncio.client.exceptions import ApiException  # noqa: E402
from kubernetes_asyncio.config import incluster_config as incluster  # noqa: E402


class KubeError(GpufedError):
    """An API call failed; `status` is the HTTP status (0 when none was received)."""

    def __init__(self, message: str, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def forbidden(self) -> bool:
        return self.status in (401, 403)

    @property
    def transient(self) -> bool:
        """No answer, throttled, or a server-side failure: worth retrying."""
        return self.status == 0 or self.status == 429 or self.status >= 500


class KubeconfigError(KubeError):
    """A kubeconfig file named on the command line is missing."""


def kubeconfig_files(kubeconfig: Path) -> list[Path]:
    """The files `kubeconfig` names: itself, or each entry of an `os.pathsep`-joined list (empty
    entries skipped, as kubectl skips them)."""
    return [Path(p) for p in str(kubeconfig).split(os.pathsep) if p]


def require_kubeconfig(path: Path, role: str = "") -> None:
    """Raise KubeconfigError (`[role ]kubeconfig PATH does not exist`) unless `path` (each file of a
    list) exists; `role` names whose kubeconfig it is when a command takes several (e.g. "provider")."""
    for file in kubeconfig_files(path) or [path]:
        if not file.exists():
            raise KubeconfigError(f"{role + ' ' if role else ''}kubeconfig {file} does not exist")


#: The kubeconfig lists merged by name; the first file that names an entry keeps it.
_NAMED_LISTS = ("clusters", "contexts", "users")


def merge_kubeconfigs(documents: list[object]) -> dict[str, Any]:
    """Parsed kubeconfigs merged as kubectl merges a KUBECONFIG list: the first document that sets a
    value or names a cluster, context or user wins; an empty document (None) adds nothing. Other
    shapes raise KubeError (their entries are checked by `check_kubeconfig`)."""
    merged: dict[str, Any] = {item: [] for item in _NAMED_LISTS}
    seen: dict[str, set[str]] = {item: set() for item in _NAMED_LISTS}
    for i, doc in enumerate(documents):
        if doc is None:
            continue
        if not isinstance(doc, Mapping):
            raise KubeError(f"invalid kubeconfig: file {i + 1} of the list is a {type(doc).__name__}, not a mapping")
        for key, value in doc.items():
            if key in _NAMED_LISTS:
                for entry in value if isinstance(value, list) else [value]:
                    name = entry.get("name") if isinstance(entry, Mapping) else None
                    if not isinstance(name, str):
                        merged[key].append(entry)  # kept for check_kubeconfig to name what is wrong
                    elif name not in seen[key]:
                        merged[key].append(entry)
                        seen[key].add(name)
            elif key not in merged and value not in (None, ""):
                merged[key] = value
    return merged


def load_kubeconfig(kubeconfig: Path) -> Any:
    """The parsed kubeconfig: one file as it is, or a list's files merged (`merge_kubeconfigs`).
    Blocking (files are read): call it from a thread in the event loop. Raises OSError and
    yaml.YAMLError as reading and parsing do."""
    files = kubeconfig_files(kubeconfig)
    if len(files) == 1:
        return yaml.safe_load(files[0].read_text())
    return merge_kubeconfigs([yaml.safe_load(f.read_text()) for f in files])


#: What the client library raises for kubeconfigs our check lets through (files it cannot read,
#: certificates it cannot parse, its own `assert`s).
_LOAD_ERRORS = (
    OSError,
    config.ConfigException,
    yaml.YAMLError,
    KeyError,
    ValueError,
    TypeError,
    AttributeError,
    AssertionError,
)
#: Fields holding base64 (decoded by the library into temporary files).
_BASE64_FIELDS = {
    "cluster": ("certificate-authority-data",),
    "user": ("client-certificate-data", "client-key-data"),
}
_STRING_FIELDS = {
    "cluster": ("server", "certificate-authority", "tls-server-name", "proxy-url"),
    "context": ("cluster", "user", "namespace"),
    "user": ("client-certificate", "client-key", "token", "tokenFile", "username", "password"),
}


def _named(kc: Mapping[str, Any], section: str, item: str) -> dict[str, Mapping[str, Any]]:
    """name -> entry of one of the kubeconfig's lists, each entry checked for shape."""
    entries = kc.get(section)
    if entries is None:
        return {}
    if not isinstance(entries, list):
        raise ValueError(f"{section} must be a list")
    out: dict[str, Mapping[str, Any]] = {}
    for i, entry in enumerate(entries):
        where = f"{section}[{i}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise ValueError(f"{where} must be a mapping with a non-empty name")
        body = entry.get(item)
        if body is None:
            body = {}
        if not isinstance(body, Mapping):
            raise ValueError(f"{where}.{item} must be a mapping")
        for field in _STRING_FIELDS[item]:
            if field in body and not isinstance(body[field], str):
                raise ValueError(f"{where}.{item}.{field} must be a string")
        for field in _BASE64_FIELDS.get(item, ()):
            if field in body:
                value = body[field]
                try:
                    if not isinstance(value, str):
                        raise TypeError
                    base64.b64decode(value, validate=True)
                except (TypeError, ValueError, binascii.Error):
                    raise ValueError(f"{where}.{item}.{field} is not valid base64") from None
        out.setdefault(entry["name"], body)
    return out


def check_kubeconfig(kc: object, context: str | None = None) -> None:
    """Raise KubeError naming what is wrong if `kc` (a parsed kubeconfig) cannot give a client for
    `context` (None: its current-context); the parts a client for that context reads are checked."""
    try:
        if not isinstance(kc, Mapping):
            got = "an empty document" if kc is None else f"a {type(kc).__name__}"
            raise ValueError(f"expected a mapping (apiVersion, clusters, contexts, users), got {got}")
        clusters = _named(kc, "clusters", "cluster")
        contexts = _named(kc, "contexts", "context")
        users = _named(kc, "users", "user")
        name = context if context is not None else kc.get("current-context")
        if not isinstance(name, str) or not name:
            raise ValueError("no context given and no current-context set")
        ctx = contexts.get(name)
        if ctx is None:
            raise ValueError(f"context {name!r} not found (contexts: {', '.join(sorted(contexts)) or 'none'})")
        cluster = clusters.get(str(ctx.get("cluster") or ""))
        if cluster is None:
            raise ValueError(f"context {name!r} names cluster {ctx.get('cluster')!r}, which is not in clusters")
        if not cluster.get("server"):
            raise ValueError(f"cluster {ctx.get('cluster')!r} has no server")
        user = ctx.get("user")
        if user and user not in users:
            raise ValueError(f"context {name!r} names user {user!r}, which is not in users")
    except ValueError as e:
        raise KubeError(f"invalid kubeconfig: {e}") from None


def map_error(e: ApiException, what: str) -> KubeError:
    return KubeError(f"{what}: {e.status} {e.reason}", status=int(e.status or 0), reason=str(e.reason or ""))


def _without_env(api: Any) -> Any:
    """`api` with its HTTP session replaced by one that ignores the environment.

    kubernetes-asyncio opens its aiohttp session with `trust_env=True`: every request then reads
    `~/.netrc` and looks up proxy variables, in a thread (about 0.35 ms of CPU per request, a quarter
    of a virtual kubelet's CPU in a burst). gpufed reaches the API servers its kubeconfigs name; a
    kubeconfig's `proxy-url` is still honoured (the library passes it per request), environment proxy
    variables and netrc credentials are not. The new session takes over the same connector (its TLS
    context and connection pool); the old one lets go of it without closing it."""
    rest_client = api.rest_client
    old = rest_client.pool_manager
    rest_client.pool_manager = aiohttp.ClientSession(
        connector=old.connector, connector_owner=True, trust_env=False, read_bufsize=2**21
    )
    old.detach()
    return api


@asynccontextmanager
async def api_client(kubeconfig: Path | None, context: str | None = None) -> AsyncIterator[Any]:
    """An ApiClient for `context` of `kubeconfig` — or, with None, the pod's own service account
    (in cluster; its projected token is re-read as the kubelet rotates it); closed on exit. Bad
    files, or None outside a pod, raise KubeError."""
    try:
        if kubeconfig is None:
            configuration = client.Configuration()
            incluster.InClusterConfigLoader(
                token_filename=incluster.SERVICE_TOKEN_FILENAME,
                cert_filename=incluster.SERVICE_CERT_FILENAME,
                try_refresh_token=True,
            ).load_and_set(configuration)
            api = _without_env(client.ApiClient(configuration))
        else:
            parsed = await asyncio.to_thread(load_kubeconfig, kubeconfig)
            check_kubeconfig(parsed, context)
            if context is None and len(kubeconfig_files(kubeconfig)) > 1:
                context = str(parsed["current-context"])  # the first file's, not the library's last
            api = _without_env(await config.new_client_from_config(config_file=str(kubeconfig), context=context))
    except KubeError as e:
        raise KubeError(f"cannot load kubeconfig {kubeconfig} (context {context or 'current'}): {e}") from None
    except (*_LOAD_ERRORS, UnicodeError) as e:
        if kubeconfig is None:
            raise KubeError(f"no kubeconfig given and not running in a pod (in-cluster configuration: {e})") from e
        raise KubeError(f"cannot load kubeconfig {kubeconfig} (context {context or 'current'}): {e}") from e
    try:
        yield api
    finally:
        await api.close()


def _data_to_files(kubeconfig: Mapping[str, Any], directory: Path) -> dict[str, Any]:
    """A copy of `kubeconfig` whose base64 `*-data` fields are files in `directory` (mode 0600)."""
    out = dict(kubeconfig)
    n = 0
    for section, item in (("clusters", "cluster"), ("users", "user")):
        entries = []
        for entry in kubeconfig.get(section) or []:
            body = dict(entry.get(item) or {})
            for data in _BASE64_FIELDS[item]:
                if data in body:
                    n += 1
                    path = directory / f"{n}.pem"
                    path.touch(mode=0o600)
                    path.write_bytes(base64.b64decode(body.pop(data)))
                    body[data.removesuffix("-data")] = str(path)
            entries.append({**entry, item: body})
        out[section] = entries
    return out


async def client_from_dict(kubeconfig: dict[str, Any], context: str | None = None) -> Any:
    """An ApiClient for an in-memory kubeconfig (e.g. credentials read from a Secret); caller closes it.

    The library writes each `*-data` field to a temporary file that it deletes only at exit and
    whose descriptor it never closes: one open descriptor and one file on disk (a private key
    among them) per new credential for the life of the process, i.e. per peering and per renewal.
    So the fields go to a private directory here instead, which lives exactly as long as the client:
    upgraded connections (exec, attach, port-forward: `gpufed.kube.upgrade`) build their TLS
    context from the configuration's file paths, so the files must outlive the client's creation."""
    check_kubeconfig(kubeconfig, context)
    tmp = tempfile.TemporaryDirectory(prefix="gpufed-kubeconfig-")
    try:
        files = await asyncio.to_thread(_data_to_files, kubeconfig, Path(tmp.name))
        api = _without_env(await config.new_client_from_config_dict(files, context=context))
    except (*_LOAD_ERRORS, binascii.Error) as e:
        tmp.cleanup()
        raise KubeError(f"invalid kubeconfig: {e}") from e
    except BaseException:
        tmp.cleanup()
        raise
    weakref.finalize(api, tmp.cleanup)  # removed with the client (closed and dropped), or at exit
    return api


@asynccontextmanager
async def translating(what: str) -> AsyncIterator[None]:
    """Turn the client library's exceptions raised inside the block into KubeError."""
    try:
        yield
    except ApiException as e:
        raise map_error(e, what) from e
    except (OSError, TimeoutError, aiohttp.ClientError) as e:
        raise KubeError(f"{what}: {e}") from e


__all__ = [
    "ApiException",
    "KubeError",
    "KubeconfigError",
    "api_client",
    "check_kubeconfig",
    "client",
    "client_from_dict",
    "kubeconfig_files",
    "load_kubeconfig",
    "map_error",
    "merge_kubeconfigs",
    "require_kubeconfig",
    "translating",
]
