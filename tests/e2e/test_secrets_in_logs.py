"""No secret, token or private key in any log line or Event of a full `gpufed local demo`.

Owns one test: it runs the whole demo in this process against the session's clusters (the same
story `make demo` tells, network included where the machine allows), and through the demo's
`before_cleanup` hook — the story done, nothing cleaned up yet — it harvests every secret value
gpufed keeps while they all exist:
- the data of every Secret gpufed created on the three clusters: all of namespace `gpufed` (cluster
  identity key, peering credentials and pending CSR keys, WireGuard private keys, serving keys of
  the webhook and the estimator), every Secret labelled `app.kubernetes.io/managed-by=gpufed`
  anywhere, and every Secret of the consumers' tenant and twin namespaces (ServiceAccount tokens the
  consumer issued for offloaded pods, reflected copies);
- the private keys and tokens in the environment's state dir (PKI keys, kubeconfigs);
- the Events of every namespace (those of the twin and demo namespaces go with the clean-up).
After the demo it reads every log file under the state dir (the clusters' components, gpufed's
controllers, the virtual kubelets, the gateway agents) plus the demo's own narration, and the
Events of every namespace again, and looks for those values in every form they could be written
in: raw, base64 as stored, a PEM body split over lines or JSON-escaped, a fragment of at least
`CHUNK` characters. It also flags what is a secret whatever its origin: PEM private keys (also
base64-encoded), JWTs and `Bearer` credentials.

The scanner is proven able to fail: the same run plants real harvested values in a log file (in
the forms above) and in an Event on the consumer, and the scan must report exactly those.

Public parts are not secrets and are not looked for: certificates, CAs, the handshake nonce (it is
in the ForeignCluster's status), a token Secret's namespace. The kube-apiserver audit log (written
only when the environment is started with auditing) records requests by design and is left out.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import json
import os
import re
import secrets
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufed.apis.wire import CONSUMER_LABEL, MANAGED_BY, MANAGED_BY_LABEL, SYSTEM_NAMESPACE, TENANT_PREFIX
from gpufed.localenv.demo import DemoSettings, run_demo
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import leftovers

pytestmark = pytest.mark.timeout(1200)

#: Fragments of this many characters are looked for: long enough never to occur by chance in base64
#: (144 bits), short enough to catch a truncated value in a log line.
CHUNK = 24
#: Runs of base64/base64url/JWT characters: where a secret fragment can sit in a line.
RUN = re.compile(rf"[A-Za-z0-9+/=_-]{{{CHUNK},}}")
PEM = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----\s*(.*?)\s*-----END \1-----", re.S)
#: Secrets whatever their origin.
PRIVATE_KEY_PEM = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")
BASE64_PEM = re.compile(r"LS0tLS1CRUdJTi[A-Za-z0-9+/=]*")  # base64 of "-----BEGIN..."
JWT = re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")
BEARER = re.compile(r"\bBearer\s+[A-Za-z0-9._~+/-]{16,}")
#: Data keys whose values are public by design.
PUBLIC_KEYS = frozenset({"ca.crt", "tls.crt", "nonce", "namespace", "service-ca.crt"})


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def private_parts(value: str) -> list[str]:
    """The secret parts of a PEM text: the bodies of its private-key blocks (certificates are public)."""
    return [re.sub(r"\s+", "", body) for kind, body in PEM.findall(value) if "PRIVATE KEY" in kind]


def secret_parts(key: str, value: bytes) -> list[str]:
    """What of a Secret's (or file's) value must never be written anywhere, in the forms it is kept in."""
    if key in PUBLIC_KEYS:
        return []
    text = value.decode(errors="replace")
    if "-----BEGIN" in text:
        keys = private_parts(text)
        return [*keys, _b64(value)] if keys else []
    if "apiVersion" in text and "clusters" in text and "users" in text:
        kubeconfig = yaml.safe_load(text) or {}
        parts = []
        for user in kubeconfig.get("users") or []:
            u = user.get("user") or {}
            if u.get("client-key-data"):
                parts += [u["client-key-data"], *private_parts(base64.b64decode(u["client-key-data"]).decode())]
            if u.get("client-key"):
                parts += private_parts(Path(u["client-key"]).read_text())
            if u.get("token"):
                parts.append(u["token"])
        return [*parts, _b64(value)] if parts else []
    return [text.strip(), _b64(value)]


@dataclass
class Scanner:
    """Every harvested secret, cut into CHUNK-character fragments, and what each belongs to."""

    fragments: dict[str, str] = field(default_factory=dict)
    #: label -> one full value (for the planted self-check)
    samples: dict[str, str] = field(default_factory=dict)
    #: runs of text already looked at -> the label they give away (logs repeat themselves)
    _seen: dict[str, str | None] = field(default_factory=dict)

    def add(self, label: str, value: str) -> None:
        for run in RUN.findall(value):
            self.samples.setdefault(label, run)
            for i in range(0, len(run) - CHUNK + 1, CHUNK):
                self.fragments[run[i : i + CHUNK]] = label
            if len(run) % CHUNK:
                self.fragments[run[-CHUNK:]] = label

    def add_secret(self, label: str, data: dict[str, str]) -> None:
        for key, encoded in data.items():
            for part in secret_parts(key, base64.b64decode(encoded)):
                self.add(f"{label}[{key}]", part)

    def scan(self, text: str) -> list[str]:
        """What `text` gives away: harvested values (by label) and anything that is a secret by its form."""
        found: set[str] = set()
        for run in RUN.findall(text):
            if run not in self._seen:
                windows = (self.fragments.get(run[i : i + CHUNK]) for i in range(len(run) - CHUNK + 1))
                self._seen[run] = next((label for label in windows if label is not None), None)
            label = self._seen[run]
            if label is not None:
                found.add(f"value of {label}")
        if PRIVATE_KEY_PEM.search(text):
            found.add("a PEM private key")
        for m in BASE64_PEM.finditer(text):
            try:
                decoded = base64.b64decode(m.group() + "==="[: -len(m.group()) % 4 or None])
            except (binascii.Error, ValueError):
                continue
            if b"PRIVATE KEY" in decoded:
                found.add("a base64-encoded PEM private key")
        if JWT.search(text):
            found.add("a JWT (bearer token)")
        if BEARER.search(text):
            found.add("a Bearer credential")
        return sorted(found)

    def scan_lines(self, where: str, lines: Iterable[str]) -> list[str]:
        return [f"{where}:{n}: {what}" for n, line in enumerate(lines, start=1) for what in self.scan(line)]


@dataclass
class Harvest:
    """What the story left in the clusters, read before the clean-up."""

    scanner: Scanner = field(default_factory=Scanner)
    secret_names: list[str] = field(default_factory=list)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def collect(self, clusters: Clusters) -> None:
        for c in clusters.topology.clusters:
            labelled = {
                n["metadata"]["name"]
                for n in clusters.kubectl_json(c.name, "get", "namespaces", "-l", CONSUMER_LABEL)["items"]
            }
            for s in clusters.kubectl_json(c.name, "get", "secrets", "-A")["items"]:
                meta = s["metadata"]
                ns = meta["namespace"]
                ours = (
                    ns == SYSTEM_NAMESPACE
                    or ns in labelled
                    or ns.startswith(TENANT_PREFIX)
                    or (meta.get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY
                )
                if ours:
                    self.secret_names.append(f"{c.name}/{ns}/{meta['name']}")
                    self.scanner.add_secret(f"Secret {c.name}/{ns}/{meta['name']}", s.get("data") or {})
            self.events += [(c.name, e) for e in clusters.kubectl_json(c.name, "get", "events", "-A")["items"]]
        for path in key_files(clusters.env.state_dir):
            for part in secret_parts(path.name, path.read_bytes()):
                self.scanner.add(f"file {path.relative_to(clusters.env.state_dir)}", part)


def key_files(state_dir: Path) -> Iterator[Path]:
    """Private keys and kubeconfigs the environment keeps (not etcd's data, not logs)."""
    for path in sorted(state_dir.rglob("*")):
        if not path.is_file() or "etcd" in path.relative_to(state_dir).parts or path.suffix == ".log":
            continue
        if path.suffix in (".key", ".kubeconfig", ".pem") or path.name == "kubeconfig":
            yield path


def log_files(state_dir: Path) -> list[Path]:
    return sorted(p for p in state_dir.rglob("*.log") if p.is_file() and "audit" not in p.relative_to(state_dir).parts)


def event_findings(scanner: Scanner, events: Iterable[tuple[str, dict[str, Any]]]) -> list[str]:
    out = []
    for cluster, e in events:
        meta = e["metadata"]
        for what in scanner.scan(json.dumps(e)):
            out.append(f"Event {cluster}/{meta.get('namespace')}/{meta['name']} ({e.get('reason')}): {what}")
    return out


def test_no_secret_token_or_key_in_any_log_line_or_event_of_the_demo(
    clusters: Clusters, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{os.environ.get('PATH', '/usr/bin:/bin')}:/usr/sbin:/sbin")
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    harvest = Harvest()

    async def before_cleanup() -> None:
        await asyncio.to_thread(harvest.collect, clusters)

    narration = io.StringIO()
    start = time.monotonic()
    code = asyncio.run(run_demo(clusters.env, DemoSettings(before_cleanup=before_cleanup), narration))
    text = narration.getvalue()
    demo_s = time.monotonic() - start
    assert leftovers(clusters) == []  # later modules start from clean clusters

    # The harvest saw what a peering with its network creates on both sides.
    names = harvest.secret_names
    for c in clusters.topology.clusters:
        assert f"{c.name}/gpufed/gpufed-identity-key" in names, names
    for prefix in ("consumer/gpufed/gpufed-remote-", "consumer/gpufed/gpufed-wg-", "gpu-a/gpufed/gpufed-wg-"):
        assert any(n.startswith(prefix) for n in names), (prefix, names)
    assert len(harvest.scanner.fragments) > 100, "nothing to look for"

    # Every log of the run, and the Events before (harvest) and after the clean-up.
    state = clusters.env.state_dir
    logs = log_files(state)
    components = {p.name for p in logs}
    assert {"gpufed-controller.log", "kube-apiserver.log"} <= components, components
    assert any(n.startswith("virtual-kubelet-") for n in components), components
    final_events = [
        (c.name, e)
        for c in clusters.topology.clusters
        for e in clusters.kubectl_json(c.name, "get", "events", "-A")["items"]
    ]
    scanner = harvest.scanner
    scan_start = time.monotonic()
    findings = scanner.scan_lines("demo narration", text.splitlines())
    scanned = 0
    for path in logs:
        content = path.read_text(errors="replace")
        scanned += len(content)
        findings += scanner.scan_lines(str(path.relative_to(state)), content.splitlines())
    findings += event_findings(scanner, [*harvest.events, *final_events])
    scan_s = time.monotonic() - scan_start
    print(
        f"demo {demo_s:.0f} s; scanned {len(logs)} log files ({scanned / 1e6:.1f} MB), "
        f"{len(harvest.events) + len(final_events)} Events, for {len(names)} Secrets "
        f"({len(scanner.fragments)} fragments) in {scan_s:.1f} s; Secrets: {', '.join(sorted(names))}"
    )
    assert findings == [], "secrets given away:\n" + "\n".join(findings[:50])

    # Self-check: real values planted in a log, in the forms a leak would take, and in an Event.
    labels = sorted(scanner.samples)
    key_label = next(lb for lb in labels if "gpufed-remote-" in lb and lb.endswith("[tls.key]"))
    wg_label = next(lb for lb in labels if "gpufed-wg-" in lb)
    planted = tmp_path / "planted.log"
    wg_value = scanner.samples[wg_label]
    pem_body = scanner.samples[key_label]
    pem_lines = "\\n".join(pem_body[i : i + 64] for i in range(0, len(pem_body), 64))
    planted.write_text(
        "\n".join(
            [
                json.dumps({"event": "harmless line", "cluster": "consumer"}),
                json.dumps({"event": "configured tunnel", "private_key": wg_value}),
                '{"event": "loaded key", "pem": "-----BEGIN PRIVATE KEY-----\\n' + pem_lines + '\\n"}',
                f"truncated: {_b64(wg_value.encode())[:40]}",
                "Authorization: Bearer " + secrets.token_urlsafe(24),
            ]
        )
    )
    got = scanner.scan_lines("planted.log", planted.read_text().splitlines())
    assert not [g for g in got if g.startswith("planted.log:1:")], got
    assert f"planted.log:2: value of {wg_label}" in got, got
    assert f"planted.log:3: value of {key_label}" in got, got
    assert "planted.log:3: a PEM private key" in got, got
    assert f"planted.log:4: value of {wg_label}" in got, got
    assert "planted.log:5: a Bearer credential" in got, got

    event = f"gpufed-planted.{secrets.token_hex(4)}"
    clusters.create(
        "consumer",
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": event, "namespace": "default"},
            "involvedObject": {"kind": "Namespace", "name": "default", "apiVersion": "v1"},
            "reason": "Planted",
            "message": f"the tunnel's key is {wg_value}",
            "type": "Warning",
        },
    )
    try:
        live = [("consumer", e) for e in clusters.kubectl_json("consumer", "get", "events", "-A")["items"]]
        assert event_findings(scanner, live) == [f"Event consumer/default/{event} (Planted): value of {wg_label}"]
    finally:
        clusters.kubectl("consumer", "delete", "event", "-n", "default", event, check=False)

    # Last, so that a demo failing for another reason (say, its tunnels on a loaded machine) still
    # has its logs scanned: a scan is only complete when the whole story ran.
    assert code == 0, "the demo failed, so not all of its story was scanned:\n" + text[-3000:]
