"""kubernetes-asyncio without its 1,200 generated modules: the library's packages initialised lazily.

Owns: `load()`, called before anything imports kubernetes-asyncio, which registers the library's
packages (`kubernetes_asyncio`, `.client`, `.client.api`, `.client.models`) in `sys.modules` as
*lazy packages*: their submodules import as usual, but the package `__init__` — which imports every
generated API class and model (about 850 modules and 33 MB of RSS per process, measured with
`make bench`'s footprint part) — runs only when someone asks the package for a name that is not a
submodule (for example `kubernetes_asyncio.client.V1Pod`). gpufed speaks raw JSON (`gpufed.kube.rest`)
and uses only the client's Configuration, ApiClient and exceptions and the config loaders, so in
gpufed's own processes the generated code is never loaded. Code that does want the models still gets
them: the first such attribute access runs the real `__init__` in place.

Written by hand because no maintained library offers it; it relies only on the import system's
documented hooks (`importlib.util.find_spec`/`module_from_spec`, PEP 562 module `__getattr__`).

Does not: change the library's behaviour, or do anything when kubernetes-asyncio was already
imported in full before `load()` (then everything is as the library made it).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

#: Packages whose __init__ imports generated code, outermost first.
LAZY_PACKAGES = (
    "kubernetes_asyncio",
    "kubernetes_asyncio.client",
    "kubernetes_asyncio.client.api",
    "kubernetes_asyncio.client.models",
)


def _lazy_package(name: str) -> ModuleType:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ImportError(f"{name} is not installed")
    module = importlib.util.module_from_spec(spec)
    loader = spec.loader
    initialised = False

    def module_getattr(attr: str) -> object:
        nonlocal initialised
        if not attr.startswith("__") and importlib.util.find_spec(f"{name}.{attr}") is not None:
            return importlib.import_module(f"{name}.{attr}")
        if not initialised:
            initialised = True
            loader.exec_module(module)  # the real __init__, in place: every name it defines appears
            if attr in module.__dict__:
                return module.__dict__[attr]
        raise AttributeError(f"module {name!r} has no attribute {attr!r}")

    setattr(module, "__getattr__", module_getattr)  # noqa: B010 (PEP 562's hook, set on a module object)
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
    return module


def load() -> None:
    """Register the lazy packages (once; a no-op when the library is already imported)."""
    if "kubernetes_asyncio" in sys.modules:
        return
    for name in LAZY_PACKAGES:
        _lazy_package(name)
    from kubernetes_asyncio.client.api_client import ApiClient
    from kubernetes_asyncio.client.configuration import Configuration

    client = sys.modules["kubernetes_asyncio.client"]
    # The config loaders do `from kubernetes_asyncio.client import ApiClient, Configuration`.
    setattr(client, "ApiClient", ApiClient)  # noqa: B010
    setattr(client, "Configuration", Configuration)  # noqa: B010


def fully_loaded() -> bool:
    """Whether the generated API classes and models have been imported (for tests and the bench)."""
    return "kubernetes_asyncio.client.models.v1_pod" in sys.modules
