"""`gpufed doctor` (gpufed.cli.doctor) against in-memory clusters served from a background event
loop: exit codes, JSON and the table, usage errors, and unreadable clusters as one-line errors."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from typer.testing import CliRunner

from gpufed.cli import app
from tests.unit.gpufed.ops.doctor.scenario import CONSUMER, PROVIDER, Env, Scenario, environment, kubeconfig_of

T = TypeVar("T")


class Background:
    """An event loop in a thread serving an `environment`, so the CLI can run its own loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.stack = contextlib.AsyncExitStack()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(20)

    def start(self, tmp_path: Path, sc: Scenario | None = None) -> Env:
        return self.call(self.stack.enter_async_context(environment(tmp_path, sc)))

    def close(self) -> None:
        self.call(self.stack.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def background() -> Iterator[Background]:
    bg = Background()
    yield bg
    bg.close()


runner = CliRunner()


def test_cli_json_and_table_of_a_healthy_peering(tmp_path: Path, background: Background) -> None:
    env = background.start(tmp_path)
    res = runner.invoke(app, ["doctor", "--kubeconfig", str(env.kubeconfig), "-o", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["clusterId"] == CONSUMER and data["status"] == "WARN"
    assert {c["name"]: c["status"] for c in data["checks"]}["api"] == "OK"
    assert data["peers"] == [{"clusterId": PROVIDER, "role": "provider"}]

    res = runner.invoke(app, ["doctor", "--kubeconfig", str(env.kubeconfig)], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "gpufed doctor: cluster" in text and "no network fabric" in text and "WARN: 11 OK, 1 WARN, 0 FAIL" in text


def test_cli_exits_1_on_a_fail(tmp_path: Path, background: Background) -> None:
    env = background.start(tmp_path, Scenario(webhook=False))
    res = runner.invoke(app, ["doctor", "--kubeconfig", str(env.kubeconfig), "-o", "json"])
    assert res.exit_code == 1, res.output
    webhook = next(c for c in json.loads(res.stdout)["checks"] if c["name"] == "webhook")
    assert webhook["status"] == "FAIL" and "--webhook-port" in webhook["fix"]


def test_cli_bad_usage_exits_2(tmp_path: Path) -> None:
    kc = tmp_path / "kubeconfig"
    res = runner.invoke(app, ["doctor", "--kubeconfig", str(kc), "-o", "xml"])
    assert res.exit_code == 2 and "--output must be one of table, wide, json, yaml" in res.output
    res = runner.invoke(app, ["doctor", "--kubeconfig", str(kc), "--timeout", "0"])
    assert res.exit_code == 2 and "--timeout must be" in res.output
    for bad in ("0", "nan"):
        res = runner.invoke(app, ["doctor", "--kubeconfig", str(kc), "--slow-api-ms", bad])
        assert res.exit_code == 2 and "--slow-api-ms must be a positive number" in res.output, bad
    res = runner.invoke(app, ["doctor", "--kubeconfig", str(kc), "--remote-cluster-id", "Bad_ID"])
    assert res.exit_code == 2 and "invalid cluster ID" in " ".join(res.output.split())
    res = runner.invoke(app, ["doctor", "--kubeconfig", str(kc)])
    assert res.exit_code == 2 and "does not exist" in " ".join(res.output.split())
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_cli_unreadable_clusters_are_one_line_errors(tmp_path: Path) -> None:
    kc = tmp_path / "kubeconfig"
    kc.write_text(yaml.safe_dump(kubeconfig_of("http://127.0.0.1:1", {"token": "x"})))
    res = runner.invoke(app, ["doctor", "--kubeconfig", str(kc), "--timeout", "2"])
    out = " ".join(res.output.split())
    assert res.exit_code == 1 and "cannot reach the API server http://127.0.0.1:1" in out, out
    assert "Traceback" not in res.output
    # What the kubeconfig itself gets wrong is a usage error, found before anything connects.
    res = runner.invoke(app, ["doctor", "--kubeconfig", str(kc), "--context", "nope"])
    assert res.exit_code == 2 and "context 'nope' not found" in " ".join(res.output.split())
    kc.write_text("not: [a kubeconfig")
    res = runner.invoke(app, ["doctor", "--kubeconfig", str(kc)])
    assert res.exit_code == 2 and "cannot load kubeconfig" in " ".join(res.output.split())
