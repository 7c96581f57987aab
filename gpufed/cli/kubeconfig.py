"""Which kubeconfig and context a verb talks to, resolved as kubectl resolves them and checked
before any connection is tried.

Owns: `resolve` (flag, else `KUBECONFIG`, else `~/.kube/config`; `--context`, else the
current-context) and `resolve_pair` (a consumer and a provider, the provider by default a context
of the same kubeconfig). Whatever is wrong locally, a file missing, not YAML, a context that is not
there, a cluster without a server, is a `UsageError` (exit code 2), so no command connects with a
kubeconfig that cannot work.

A resolved KUBECONFIG list stays a list: its files (those that exist and are not empty, as kubectl
ignores the others) joined by `os.pathsep` in one Path, which `gpufed.kube.client` merges as
kubectl does. The context comes back by name, so every later step uses the same one.

Does not connect, and does not decide how the long-running verbs (controller, virtual kubelet,
gateway, GPU agent) find their identity: without `--kubeconfig` they use the pod's service account.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from gpufed.errors import UsageError

#: Where kubectl looks when neither --kubeconfig nor KUBECONFIG says.
DEFAULT_KUBECONFIG = Path("~") / ".kube" / "config"

#: Flags every verb that reads a cluster shares.
Kubeconfig = Annotated[
    Path | None,
    typer.Option(
        "--kubeconfig",
        help="kubeconfig file (default: the files $KUBECONFIG lists, merged as kubectl does, else ~/.kube/config)",
        show_default=False,
    ),
]
Context = Annotated[
    str | None, typer.Option("--context", help="context of the kubeconfig (default: its current-context)")
]
RemoteKubeconfig = Annotated[
    Path | None,
    typer.Option(
        "--remote-kubeconfig",
        help="kubeconfig of the provider cluster (default: the consumer's kubeconfig, with --remote-context)",
        show_default=False,
    ),
]
RemoteContext = Annotated[
    str | None,
    typer.Option("--remote-context", help="context of the provider's kubeconfig (default: its current-context)"),
]


@dataclass(frozen=True)
class Target:
    """A cluster as a command reaches it: the kubeconfig (one file or an `os.pathsep`-joined list)
    and the context, by name."""

    kubeconfig: Path
    context: str


def _label(role: str) -> str:
    return f"{role} kubeconfig" if role else "kubeconfig"


def kubeconfig_path(
    flag: Path | None, *, role: str = "", env: Mapping[str, str] | None = None, home: Path | None = None
) -> Path:
    """The kubeconfig kubectl would use: `flag` (which must exist), else the existing files of the
    KUBECONFIG list, else ~/.kube/config. UsageError when there is none."""
    environ = os.environ if env is None else env
    if flag is not None:
        path = flag.expanduser()
        if not path.is_file():
            raise UsageError(f"{_label(role)} {flag} does not exist")
        return path
    listed = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        existing = [Path(p).expanduser() for p in listed if Path(p).expanduser().is_file()]
        if not existing:
            raise UsageError(f"{_label(role)}: none of the files KUBECONFIG lists exists ({os.pathsep.join(listed)})")
        return Path(os.pathsep.join(str(p) for p in existing))
    default = (home / ".kube" / "config") if home is not None else DEFAULT_KUBECONFIG.expanduser()
    if not default.is_file():
        raise UsageError(f"no {_label(role)}: pass --kubeconfig FILE, set KUBECONFIG or create {default}")
    return default


def _without_empty_files(path: Path) -> Path:
    """A list without the files that hold no document (kubectl reads them as empty configs; the
    client library cannot start a merge with one)."""
    files = str(path).split(os.pathsep)
    if len(files) == 1:
        return path
    kept = [f for f in files if Path(f).read_text().strip()]
    return Path(os.pathsep.join(kept or files[:1]))


def resolve(
    flag: Path | None,
    context: str | None,
    *,
    role: str = "",
    env: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> Target:
    """The kubeconfig and context of one cluster, both checked locally; UsageError names what is
    wrong (`role` says whose kubeconfig, when a command takes two)."""
    import yaml

    from gpufed.kube.client import KubeError, check_kubeconfig, load_kubeconfig

    path = kubeconfig_path(flag, role=role, env=env, home=home)
    try:
        path = _without_empty_files(path)
        parsed = load_kubeconfig(path)
    except (OSError, UnicodeError) as e:
        raise UsageError(f"cannot read {_label(role)} {path}: {e}") from None
    except yaml.YAMLError as e:
        raise UsageError(f"cannot load {_label(role)} {path}: not YAML ({' '.join(str(e).split())})") from None
    try:
        check_kubeconfig(parsed, context)
    except KubeError as e:
        raise UsageError(f"cannot load {_label(role)} {path}: {e}") from None
    return Target(path, context if context is not None else str(parsed["current-context"]))


def resolve_pair(
    kubeconfig: Path | None, context: str | None, remote_kubeconfig: Path | None, remote_context: str | None
) -> tuple[Target, Target]:
    """The consumer and the provider. The provider is named by --remote-kubeconfig, --remote-context
    or both; with only --remote-context it is a context of the consumer's kubeconfig."""
    if remote_kubeconfig is None and remote_context is None:
        raise UsageError(
            "name the provider: --remote-kubeconfig FILE, --remote-context NAME (a context of the same "
            "kubeconfig), or both"
        )
    consumer = resolve(kubeconfig, context, role="consumer")
    if remote_kubeconfig is None:
        provider = resolve(None, remote_context, role="provider", env={"KUBECONFIG": str(consumer.kubeconfig)})
    else:
        provider = resolve(remote_kubeconfig, remote_context, role="provider")
    return consumer, provider
