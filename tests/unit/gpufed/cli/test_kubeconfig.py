"""The kubeconfig and context every verb uses, resolved as kubectl resolves them
(gpufed.cli.kubeconfig): --kubeconfig, else the KUBECONFIG list merged, else ~/.kube/config;
--context, else the current-context; and whatever is wrong locally is exit code 2, before any
connection is tried (a listening socket counts the attempts)."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpufed.cli import app
from gpufed.cli.kubeconfig import resolve, resolve_pair
from gpufed.errors import UsageError
from gpufed.kube.client import api_client, load_kubeconfig, merge_kubeconfigs

runner = CliRunner()


def config(
    contexts: dict[str, str], current: str | None = None, *, user: str = "u", token: str = "x"
) -> dict[str, Any]:
    """A kubeconfig with one cluster per context (context name -> server), all with one user."""
    cfg: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": f"{name}-cluster", "cluster": {"server": server}} for name, server in contexts.items()],
        "contexts": [{"name": name, "context": {"cluster": f"{name}-cluster", "user": user}} for name in contexts],
        "users": [{"name": user, "user": {"token": token}}],
    }
    if current is not None:
        cfg["current-context"] = current
    return cfg


def write(path: Path, cfg: object) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


class Listener:
    """A TCP port that accepts and counts connections but never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.setblocking(False)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def connections(self) -> int:
        n = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return n
            conn.close()
            n += 1


@pytest.fixture
def listener() -> Iterator[Listener]:
    lst = Listener()
    yield lst
    lst.sock.close()


# ---------------------------------------------------------------------------- resolution


def test_the_flag_wins_over_kubeconfig_and_must_exist(tmp_path: Path) -> None:
    flag = write(tmp_path / "flag", config({"a": "https://a"}, "a"))
    env = write(tmp_path / "env", config({"b": "https://b"}, "b"))
    target = resolve(flag, None, env={"KUBECONFIG": str(env)}, home=tmp_path)
    assert (target.kubeconfig, target.context) == (flag, "a")
    with pytest.raises(UsageError, match=r"kubeconfig .*/none does not exist") as e:
        resolve(tmp_path / "none", None, env={"KUBECONFIG": str(env)}, home=tmp_path)
    assert e.value.exit_code == 2


def test_kubeconfig_lists_are_merged_first_file_wins(tmp_path: Path) -> None:
    first = write(tmp_path / "first", config({"consumer": "https://consumer", "shared": "https://first"}, "consumer"))
    second = write(tmp_path / "second", config({"gpu-a": "https://gpu-a", "shared": "https://second"}, "gpu-a"))
    env = {"KUBECONFIG": os.pathsep.join([str(tmp_path / "missing"), str(first), "", str(second)])}
    target = resolve(None, None, env=env, home=tmp_path)
    # the missing file and the empty entry are skipped, as kubectl skips them
    assert target.kubeconfig == Path(f"{first}{os.pathsep}{second}")
    assert target.context == "consumer"  # the first file that sets current-context
    assert resolve(None, "gpu-a", env=env, home=tmp_path).context == "gpu-a"  # a context of the second file
    merged = load_kubeconfig(target.kubeconfig)
    servers = {c["name"]: c["cluster"]["server"] for c in merged["clusters"]}
    assert servers == {
        "consumer-cluster": "https://consumer",
        "shared-cluster": "https://first",
        "gpu-a-cluster": "https://gpu-a",
    }


def test_merging_keeps_the_first_value_and_skips_empty_documents() -> None:
    merged = merge_kubeconfigs(
        [None, {"current-context": "", "preferences": {"a": 1}}, {"current-context": "x", "preferences": {"b": 2}}]
    )
    assert merged["current-context"] == "x" and merged["preferences"] == {"a": 1}
    assert merged["clusters"] == merged["contexts"] == merged["users"] == []


def test_an_empty_file_in_the_list_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("")
    real = write(tmp_path / "real", config({"a": "https://a"}, "a"))
    target = resolve(None, None, env={"KUBECONFIG": f"{tmp_path / 'empty'}{os.pathsep}{real}"}, home=tmp_path)
    assert (target.kubeconfig, target.context) == (real, "a")


def test_without_flag_or_kubeconfig_the_home_config_is_used(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"no kubeconfig: pass --kubeconfig FILE, set KUBECONFIG or create "):
        resolve(None, None, env={}, home=tmp_path)
    (tmp_path / ".kube").mkdir()
    home = write(tmp_path / ".kube" / "config", config({"mine": "https://mine"}, "mine"))
    target = resolve(None, None, env={"KUBECONFIG": ""}, home=tmp_path)  # set but empty: as unset
    assert (target.kubeconfig, target.context) == (home, "mine")


def test_a_list_of_missing_files_is_a_usage_error(tmp_path: Path) -> None:
    env = {"KUBECONFIG": f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}"}
    with pytest.raises(UsageError, match=r"none of the files KUBECONFIG lists exists"):
        resolve(None, None, env=env, home=tmp_path)


def test_what_the_kubeconfig_gets_wrong_is_named(tmp_path: Path) -> None:
    kc = write(tmp_path / "kc", config({"a": "https://a"}))
    with pytest.raises(UsageError, match=r"no context given and no current-context set"):
        resolve(kc, None, env={}, home=tmp_path)
    with pytest.raises(UsageError, match=r"context 'b' not found \(contexts: a\)"):
        resolve(kc, "b", env={}, home=tmp_path)
    (tmp_path / "bad").write_text("clusters: [")
    with pytest.raises(UsageError, match=r"cannot load kubeconfig .*bad: not YAML"):
        resolve(tmp_path / "bad", None, env={}, home=tmp_path)


def test_the_provider_defaults_to_a_context_of_the_same_kubeconfig(tmp_path: Path) -> None:
    kc = write(tmp_path / "kc", config({"consumer": "https://c", "gpu-a": "https://a"}, "consumer"))
    consumer, provider = resolve_pair(kc, None, None, "gpu-a")
    assert (consumer.kubeconfig, consumer.context, provider.kubeconfig, provider.context) == (
        kc,
        "consumer",
        kc,
        "gpu-a",
    )
    with pytest.raises(UsageError, match=r"name the provider"):
        resolve_pair(kc, None, None, None)
    with pytest.raises(UsageError, match=r"provider kubeconfig .*/none does not exist"):
        resolve_pair(kc, None, tmp_path / "none", None)


def test_the_client_of_a_list_uses_the_first_current_context(tmp_path: Path) -> None:
    """The client library alone takes the last file's current-context; gpufed.kube.client hands it
    the first, as kubectl uses it."""
    first = write(tmp_path / "first", config({"one": "https://one.example"}, "one"))
    second = write(tmp_path / "second", config({"two": "https://two.example"}, "two"))

    async def host(context: str | None) -> str:
        async with api_client(Path(f"{first}{os.pathsep}{second}"), context) as api:
            return str(api.configuration.host)

    assert asyncio.run(host(None)) == "https://one.example"
    assert asyncio.run(host("two")) == "https://two.example"


# ---------------------------------------------------------------------------- through the CLI


def test_kubeconfig_lists_reach_the_right_cluster(tmp_path: Path, listener: Listener) -> None:
    """`KUBECONFIG=a:b gpufed doctor` talks to the current context of a, the first file that sets one."""
    first = write(tmp_path / "first", config({"consumer": listener.url}, "consumer"))
    second = write(tmp_path / "second", config({"gpu-a": "http://127.0.0.1:1"}, "gpu-a"))
    env = {"KUBECONFIG": f"{first}{os.pathsep}{second}"}
    res = runner.invoke(app, ["doctor", "--timeout", "0.5"], env=env)
    assert res.exit_code == 1 and listener.url in res.stderr and "context consumer" in res.stderr, res.output
    assert listener.connections() == 1
    res = runner.invoke(app, ["doctor", "--timeout", "0.5", "--context", "gpu-a"], env=env)
    assert res.exit_code == 1 and "127.0.0.1:1" in res.stderr and listener.connections() == 0, res.output


def test_the_home_kubeconfig_is_the_default(
    tmp_path: Path, listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    res = runner.invoke(app, ["pool"])
    assert res.exit_code == 2 and "no kubeconfig: pass --kubeconfig FILE" in res.stderr, res.output
    (tmp_path / ".kube").mkdir()
    write(tmp_path / ".kube" / "config", config({"home": listener.url}, "home"))
    res = runner.invoke(app, ["doctor", "--timeout", "0.5"])
    assert res.exit_code == 1 and listener.url in res.stderr and listener.connections() == 1, res.output


USAGE_ERRORS: list[tuple[list[str], str]] = [
    (["pool", "--context", "nope"], "context 'nope' not found"),
    (["pool", "-o", "xml"], "--output must be one of table, wide, json, yaml"),
    (["info", "--context", "nope"], "context 'nope' not found"),
    (["info", "-o", "csv"], "--output must be one of"),
    (["network", "status", "-o", "csv"], "--output must be one of"),
    (["doctor", "-o", "csv"], "--output must be one of"),
    (["doctor", "--timeout", "-1"], "--timeout must be a positive number"),
    (["network", "expose", "not-an-ip"], "is not an IPv4 address"),
    (["peer"], "name the provider"),
    (["peer", "--remote-context", "nope"], "context 'nope' not found"),
    (["peer", "--remote-context", "c", "--gpus", "-2"], "must not be negative"),
    (["peer", "--remote-context", "c", "--cpu", "lots"], "invalid slice"),
    (["peer", "--remote-context", "c", "--timeout", "0"], "--timeout must be a positive number"),
    (["peer", "--remote-kubeconfig", "/nonexistent/kc"], "provider kubeconfig /nonexistent/kc does not exist"),
    (["unpeer"], "name the provider"),
    (["network", "connect", "--remote-context", "c", "--mtu", "600"], "--mtu must be 0 (automatic) or 1280..9000"),
    (["network", "connect", "--remote-context", "c", "--pod-cidr", "10.0.0.0/33"], "--pod-cidr: invalid pod CIDR"),
    (["peer", "--remote-context", "c", "--gateway-endpoint", "gw:0"], "--gateway-endpoint: "),
    (["network", "disconnect"], "name the provider"),
    (["offload-namespace", "Team_A"], "is not a namespace name"),
    (["offload-namespace", "team-a", "--selector", "a=b=c"], "cannot parse selector"),
    (["offload-namespace", "team-a", "--pod-strategy", "Anywhere"], "invalid offloading"),
    (["unoffload-namespace", "team-a", "--context", "nope"], "context 'nope' not found"),
]


@pytest.mark.parametrize(("args", "message"), USAGE_ERRORS, ids=[" ".join(a) for a, _ in USAGE_ERRORS])
def test_usage_errors_exit_2_before_any_connection(
    tmp_path: Path, listener: Listener, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    kc = write(tmp_path / "kc", config({"c": listener.url}, "c"))
    monkeypatch.setenv("KUBECONFIG", str(kc))
    res = runner.invoke(app, args)
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    assert message in " ".join(res.stderr.split()) and res.stdout == "", res.output
    assert listener.connections() == 0, "a usage error must not connect"


def test_a_valid_command_does_connect(tmp_path: Path, listener: Listener, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control for the test above: the same kubeconfig and listener see the connection."""
    kc = write(tmp_path / "kc", config({"c": listener.url}, "c"))
    monkeypatch.setenv("KUBECONFIG", str(kc))
    res = runner.invoke(app, ["doctor", "--timeout", "0.5"])
    assert res.exit_code == 1 and listener.connections() == 1, res.output
