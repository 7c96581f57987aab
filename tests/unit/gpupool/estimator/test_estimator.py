"""The capacity estimator (gpupool.estimator): a real grpc.aio server on 127.0.0.1 with mutual TLS,
the cluster behind it an in-memory API server (nodes, pods, Tenants, the client-CA ConfigMap), and
the client that consumers use. Certificates are made here: the cluster's client CA issuing consumer
certificates (right and wrong subjects) and a foreign CA."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import datetime as dt
import ipaddress
import socket
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpufed.apis.meta import API_VERSION
from gpufed.apis.wire import ESTIMATOR_CONFIGMAP, ESTIMATOR_TLS_SECRET, SYSTEM_NAMESPACE, ClusterID
from gpufed.devtools import protogen as codegen
from gpufed.kube import manifests
from gpufed.kube.servingtls import TLSMaterial, issue, usable
from gpupool.capacity import Bucket, Placement, PodShape, ProductCapacity, Snapshot, Toleration
from gpupool.estimator import estimator_pb2 as pb
from gpupool.estimator import wire
from gpupool.estimator.client import EstimatorClient, EstimatorError, from_provider
from gpupool.estimator.server import (
    EstimatorConfigError,
    EstimatorServer,
    EstimatorServerSettings,
    RefusalError,
    advertised_host,
    authorize,
    consumer_of,
    split_endpoint,
)
from peering.handshake import CONSUMER_GROUP, consumer_user
from tests.paths import REPO
from tests.unit.fakes import FakeApiServer, running, serve, until

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-40GB"
CONSUMER = ClusterID("consumer-1234abcd")
CHALLENGED = ClusterID("pending-5678abcd")
STRANGER = ClusterID("stranger-9999abcd")
PEM = serialization.Encoding.PEM


# ---- certificates


@dataclass(frozen=True)
class CA:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(PEM)

    @staticmethod
    def new(name: str) -> CA:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(key, hashes.SHA256())
        )
        return CA(cert, key)

    def issue(self, cn: str, orgs: tuple[str, ...] = (CONSUMER_GROUP,)) -> tuple[bytes, bytes]:
        """(certificate PEM, key PEM) of a client certificate, as the cluster's CSR signer makes them."""
        key = ec.generate_private_key(ec.SECP256R1())
        names = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([*names, x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        return cert.public_bytes(PEM), key.private_bytes(
            PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )


CLUSTER_CA = CA.new("cluster-ca")
FOREIGN_CA = CA.new("cluster-ca")  # same name, other key: must not be trusted
GOOD = CLUSTER_CA.issue(consumer_user(CONSUMER))


# ---- the cluster


def node(name: str, *, gpus: int = 8, product: str = H100, ready: bool = True) -> dict[str, Any]:
    alloc = {"cpu": "96", "memory": "1024Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product, "nvidia.com/gpu.memory": "81559"}},
        "spec": {},
        "status": {
            "allocatable": alloc,
            "capacity": alloc,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(name: str, node_name: str, gpus: int, namespace: str = "team") -> dict[str, Any]:
    requests = {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": str(gpus)}
    return {
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"nodeName": node_name, "containers": [{"name": "c", "resources": {"requests": requests}}]},
        "status": {"phase": "Running"},
    }


def tenant(consumer: str, phase: str) -> dict[str, Any]:
    return {
        "metadata": {"name": consumer},
        "spec": {"consumerClusterId": consumer, "publicKey": "k"},
        "status": {"phase": phase},
    }


def seed(server: FakeApiServer, client_ca: bytes = CLUSTER_CA.pem) -> None:
    server.create(
        "configmaps",
        {
            "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
            "data": {"client-ca-file": client_ca.decode()},
        },
    )
    server.create("tenants", tenant(CONSUMER, "Authenticated"), API_VERSION)
    server.create("tenants", tenant(CHALLENGED, "Challenged"), API_VERSION)
    for i in range(4):
        server.create("nodes", node(f"h100-{i}"))
    server.create("nodes", node("h100-down", ready=False))
    server.create("nodes", node("a100-0", gpus=4, product=A100))
    server.create("pods", pod("train-0", "h100-0", 6))
    server.create("pods", pod("train-1", "h100-1", 6))
    server.create("pods", pod("train-2", "h100-2", 2))


@dataclass
class Running:
    fake: FakeApiServer
    api: Any
    est: EstimatorServer

    @property
    def endpoint(self) -> str:
        assert self.est.endpoint is not None
        return self.est.endpoint

    @property
    def ca(self) -> bytes:
        assert self.est.cert is not None
        return self.est.cert.ca_pem

    def client(self, creds: tuple[bytes, bytes] = GOOD, timeout_s: float = 2.0) -> EstimatorClient:
        return EstimatorClient(self.endpoint, self.ca, creds[0], creds[1], timeout_s=timeout_s)


@contextlib.asynccontextmanager
async def started(fake: FakeApiServer | None = None, *, seeded: bool = True, **settings: Any) -> AsyncIterator[Running]:
    async with serve(fake) as (server, api):
        if seeded and fake is None:
            seed(server)
        opts: dict[str, Any] = {"port": 0, "debounce_s": 0.02, "heartbeat_s": 0.3, **settings}
        est = EstimatorServer(api, EstimatorServerSettings(**opts))
        async with running(est.run()) as task:
            await until(lambda: est.ready.is_set() or task.done(), what="estimator ready")
            if task.done():
                task.result()
            yield Running(server, api, est)


# ---- serving


async def test_get_capacity_serves_the_aggregates() -> None:
    async with started() as r, r.client() as c:
        snap = await c.get_capacity()
        assert snap == r.est.snapshot
        assert snap.revision == 1 and snap.gpu_products() == [A100, H100]
        h = snap.product(H100)
        assert h is not None
        assert (h.nodes, h.unhealthy_nodes, h.total, h.allocatable, h.in_use, h.free) == (4, 1, 40, 32, 14, 18)
        assert h.histogram == (Bucket(8, 1), Bucket(6, 1), Bucket(2, 2))
        assert h.largest_shape == 8 and h.gpu_memory_mib == 81559
        # Aggregates only: no node or pod name is on the wire.
        raw = wire.snapshot_to_pb(snap).SerializeToString()
        assert b"h100-0" not in raw and b"train" not in raw and b"team" not in raw


async def test_can_place_and_max_replicas_answer_with_reasons() -> None:
    async with started() as r, r.client() as c:
        yes = await c.can_place(PodShape(gpus=8, gpu_product=H100))
        assert yes == Placement(True, f"a pod of 8 GPUs fits on 1 node of {H100} (largest free on one node: 8 GPUs)", 1)
        no = await c.can_place(PodShape(gpus=5, gpu_product=A100))
        assert not no.placeable and no.reason == (
            f"no node of {A100} has 5 free GPUs (largest free on one node: 4; 4 free in total)"
        )
        unknown = await c.can_place(PodShape(gpus=1, gpu_product="NVIDIA-B200"))
        assert not unknown.placeable and "nvidia.com/gpu.product=NVIDIA-B200" in unknown.reason
        assert await c.max_replicas(PodShape(gpus=2, gpu_product=H100)) == (
            1 + 1 + 3 + 4,
            f"9 pods of 2 GPUs fit on 4 nodes of {H100}",
        )
        tolerant = PodShape(gpus=1, tolerations=(Toleration("x", "Exists"),), node_selector=(("zone", "b"),))
        assert (await c.max_replicas(tolerant))[0] == 0


async def test_watch_streams_changes_then_heartbeats() -> None:
    async with started() as r, r.client() as c:
        stream = c.watch(idle_timeout_s=2)
        first = await anext(stream)
        assert first.revision == 1
        r.fake.create("pods", pod("train-3", "h100-3", 4))
        second = await anext(stream)
        h = second.product(H100)
        assert second.revision == 2 and h is not None and h.in_use == 18 and h.free == 14
        # A node heartbeat changes nothing: the next message is a heartbeat of revision 2.
        r.fake.update("nodes", "", "h100-0", lambda n: n["status"].update(heartbeat="now"))
        beat = await anext(stream)
        assert beat.revision == 2 and beat.products == second.products
        assert beat.observed_at > second.observed_at
        await stream.aclose()


async def test_unpeering_ends_an_open_watch() -> None:
    async with started() as r, r.client() as c:
        stream = c.watch(idle_timeout_s=2)
        await anext(stream)
        r.fake.update("tenants", "", CONSUMER, lambda t: t["status"].update(phase="Refused"))
        with pytest.raises(EstimatorError) as err:
            while True:
                await anext(stream)
        assert err.value.code == "PERMISSION_DENIED"
        assert f"consumer {CONSUMER} is not authenticated here (its Tenant is Refused" in str(err.value)


# ---- who may ask


@pytest.mark.parametrize(
    ("creds", "code", "message"),
    [
        (CLUSTER_CA.issue("gpufed:virtual-kubelet"), "PERMISSION_DENIED", "is not a gpufed consumer"),
        (
            CLUSTER_CA.issue(consumer_user(CONSUMER), orgs=("system:masters",)),
            "PERMISSION_DENIED",
            "O=gpufed:consumers",
        ),
        (CLUSTER_CA.issue(consumer_user(STRANGER)), "PERMISSION_DENIED", f"consumer {STRANGER} is not peered"),
        (
            CLUSTER_CA.issue(consumer_user(CHALLENGED)),
            "PERMISSION_DENIED",
            f"consumer {CHALLENGED} is not authenticated here (its Tenant is Challenged, not Authenticated)",
        ),
        (FOREIGN_CA.issue(consumer_user(CONSUMER)), "UNAVAILABLE", "TLS handshake failed"),
    ],
    ids=["wrong-cn", "wrong-org", "unknown-tenant", "not-authenticated", "foreign-ca"],
)
async def test_callers_that_are_not_authenticated_consumers_are_refused(
    creds: tuple[bytes, bytes], code: str, message: str
) -> None:
    async with started() as r, r.client(creds) as c:
        for call in (c.get_capacity(), c.can_place(PodShape(gpus=1))):
            with pytest.raises(EstimatorError) as err:
                await call
            assert err.value.code == code
            assert message in str(err.value) and r.endpoint in str(err.value)
        with pytest.raises(EstimatorError) as werr:
            await anext(c.watch())
        assert werr.value.code == code


async def test_a_client_without_certificate_is_refused_by_the_handshake() -> None:
    async with started() as r:
        channel = grpc.aio.secure_channel(r.endpoint, grpc.ssl_channel_credentials(root_certificates=r.ca))
        call = channel.unary_unary(
            wire.GET_CAPACITY,
            request_serializer=pb.CapacityRequest.SerializeToString,
            response_deserializer=pb.Snapshot.FromString,
        )
        try:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call(pb.CapacityRequest(), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            await channel.close()


async def test_a_new_client_ca_is_trusted_from_the_next_handshake() -> None:
    new_ca = CA.new("rotated-ca")
    async with started() as r:
        r.fake.update(
            "configmaps",
            "kube-system",
            "extension-apiserver-authentication",
            lambda cm: cm["data"].update({"client-ca-file": new_ca.pem.decode()}),
        )
        await until(lambda: r.est.client_ca == new_ca.pem, what="new client CA loaded")
        async with r.client(new_ca.issue(consumer_user(CONSUMER))) as c:
            assert (await c.get_capacity()).revision == 1
        async with r.client(GOOD) as old:
            with pytest.raises(EstimatorError) as err:
                await old.get_capacity()
            assert err.value.code == "UNAVAILABLE"


def test_authorize_without_a_certificate_is_unauthenticated() -> None:
    with pytest.raises(RefusalError) as err:
        authorize({"transport_security_type": [b"ssl"]}, {CONSUMER: "Authenticated"})
    assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert "client certificate is required" in err.value.message


def test_consumer_of_reads_the_identity_from_the_subject() -> None:
    assert consumer_of(GOOD[0]) == CONSUMER
    for bad in ("gpufed:consumer:", "gpufed:consumer:UPPER", "gpufed:consumers"):
        with pytest.raises(RefusalError):
            consumer_of(CLUSTER_CA.issue(bad)[0])


# ---- publication: ConfigMap and Secret


async def test_configmap_and_secret_are_published_and_reused_after_a_restart() -> None:
    fake = FakeApiServer()
    seed(fake)
    async with started(fake) as r:
        cm = fake.get("configmaps", SYSTEM_NAMESPACE, ESTIMATOR_CONFIGMAP)
        assert cm is not None and cm["data"] == {"endpoint": r.endpoint, "ca.crt": r.ca.decode()}
        assert r.endpoint.startswith("127.0.0.1:")
        secret = fake.get("secrets", SYSTEM_NAMESPACE, ESTIMATOR_TLS_SECRET)
        assert secret is not None and secret["type"] == "kubernetes.io/tls"
        assert base64.b64decode(secret["data"]["ca.crt"]) == r.ca
        first_cert = r.ca
        assert b"PRIVATE KEY" not in str(cm).encode()
    async with started(fake) as again:
        assert again.ca == first_cert, "the stored certificate is reused"
        async with again.client() as c:
            assert (await c.get_capacity()).gpu_products() == [A100, H100]
    # Advertised under another name: the certificate must name it, so a new one is issued.
    async with started(fake, address="localhost:1") as named:
        assert named.ca != first_cert and named.endpoint == "localhost:1"
        assert named.est.cert is not None
        cert = x509.load_pem_x509_certificate(named.est.cert.cert_pem)  # the serving certificate
        assert cert.issuer == x509.load_pem_x509_certificate(named.ca).subject
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
        cm = fake.get("configmaps", SYSTEM_NAMESPACE, ESTIMATOR_CONFIGMAP)
        assert cm is not None and cm["data"]["endpoint"] == "localhost:1"


async def test_it_waits_for_the_client_ca_before_serving() -> None:
    fake = FakeApiServer()
    seed(fake)
    fake.remove("configmaps", "kube-system", "extension-apiserver-authentication")
    async with serve(fake) as (server, api):
        est = EstimatorServer(api, EstimatorServerSettings(port=0, debounce_s=0.01))
        async with running(est.run()):
            await asyncio.sleep(0.2)
            assert not est.ready.is_set() and server.get("configmaps", SYSTEM_NAMESPACE, ESTIMATOR_CONFIGMAP) is None
            seed_ca = {
                "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
                "data": {"client-ca-file": CLUSTER_CA.pem.decode()},
            }
            server.create("configmaps", seed_ca)
            await until(est.ready.is_set, what="ready once the CA exists")


async def test_a_busy_port_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        async with serve() as (server, api):
            seed(server)
            est = EstimatorServer(api, EstimatorServerSettings(port=port))
            with pytest.raises(ExceptionGroup) as err:
                await asyncio.wait_for(est.run(), 3)
            assert err.group_contains(EstimatorConfigError, match=f"cannot listen on 127.0.0.1:{port}")
            assert not est.ready.is_set()


def test_serving_certificate_checks() -> None:
    now = dt.datetime.now(dt.UTC)
    cert = issue("10.0.0.5", days=365, now=now)
    assert usable(cert, "10.0.0.5", dt.timedelta(days=30), now)
    assert not usable(cert, "10.0.0.6", dt.timedelta(days=30), now), "another host"
    assert not usable(cert, "10.0.0.5", dt.timedelta(days=30), now + dt.timedelta(days=340)), "due"
    other = issue("10.0.0.5")
    assert not usable(TLSMaterial(cert.ca_pem, cert.cert_pem, other.key_pem), "10.0.0.5", dt.timedelta(0), now)
    assert not usable(TLSMaterial(b"junk", b"junk", b"junk"), "10.0.0.5", dt.timedelta(0), now)
    dns = issue("estimator.gpu-a.example")
    assert usable(dns, "estimator.gpu-a.example", dt.timedelta(days=1))
    ca = x509.load_pem_x509_certificate(cert.ca_pem)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca, "what consumers trust is a CA"
    parsed = x509.load_pem_x509_certificate(cert.cert_pem)
    assert parsed.issuer == ca.subject
    ip = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ip.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.5")]


def test_endpoints_and_advertised_hosts() -> None:
    assert split_endpoint("10.0.0.5:7443") == ("10.0.0.5", 7443)
    assert split_endpoint("[fd00::1]:7443") == ("fd00::1", 7443)
    assert split_endpoint("est.example:1") == ("est.example", 1)
    for bad in ("10.0.0.5", "fd00::1:7443", ":7443", "h:0", "h:99999", "h:x"):
        with pytest.raises(EstimatorConfigError):
            split_endpoint(bad)
    assert advertised_host(EstimatorServerSettings(port=1, host="10.1.2.3")) == "10.1.2.3"
    assert advertised_host(EstimatorServerSettings(port=1, host="0.0.0.0", address="gpu-a.example:7443")) == (
        "gpu-a.example"
    )
    with pytest.raises(EstimatorConfigError, match="--estimator-address"):
        advertised_host(EstimatorServerSettings(port=1, host="0.0.0.0"))


# ---- the client


def _kubeconfig(cert: bytes, key: bytes) -> dict[str, Any]:
    b64 = base64.b64encode
    return {
        "clusters": [{"name": "p", "cluster": {"server": "https://x"}}],
        "users": [
            {"name": "other", "user": {"token": "t"}},
            {
                "name": "me",
                "user": {"client-certificate-data": b64(cert).decode(), "client-key-data": b64(key).decode()},
            },
        ],
        "contexts": [{"name": "p", "context": {"cluster": "p", "user": "me"}}],
        "current-context": "p",
    }


async def test_from_provider_finds_the_estimator_through_its_configmap() -> None:
    async with started() as r:
        client = await from_provider(r.api, _kubeconfig(*GOOD))
        assert client is not None and client.endpoint == r.endpoint
        async with client:
            assert (await client.get_capacity()).revision == 1
        with pytest.raises(EstimatorError, match="no client certificate"):
            await from_provider(r.api, {"users": [{"name": "me", "user": {"token": "t"}}]})
        r.fake.update("configmaps", SYSTEM_NAMESPACE, ESTIMATOR_CONFIGMAP, lambda cm: cm["data"].pop("ca.crt"))
        with pytest.raises(EstimatorError, match=r"lacks ca\.crt"):
            await from_provider(r.api, _kubeconfig(*GOOD))
        r.fake.remove("configmaps", SYSTEM_NAMESPACE, ESTIMATOR_CONFIGMAP)
        assert await from_provider(r.api, _kubeconfig(*GOOD)) is None


async def test_client_errors_name_the_endpoint_and_never_leak_grpc() -> None:
    # Nothing listens there: the call fails at once with a sentence, not a grpc exception.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cert = issue("127.0.0.1")
    async with EstimatorClient(f"127.0.0.1:{port}", cert.ca_pem, *GOOD, timeout_s=1) as c:
        with pytest.raises(EstimatorError) as err:
            await c.max_replicas(PodShape(gpus=1))
        assert err.value.code == "UNAVAILABLE"
        assert str(err.value).startswith(f"capacity estimator at 127.0.0.1:{port}: MaxReplicas failed: not reachable")
        with pytest.raises(EstimatorError):
            await anext(c.watch())


async def test_watch_gives_up_when_the_stream_goes_silent() -> None:
    async with started(heartbeat_s=30) as r, r.client() as c:
        stream = c.watch(idle_timeout_s=0.2)
        assert (await anext(stream)).revision == 1
        with pytest.raises(EstimatorError, match=r"no snapshot or heartbeat for 0\.2 s") as err:
            await anext(stream)
        assert err.value.code == "DEADLINE_EXCEEDED"


# ---- wire and code generation


def test_wire_round_trips() -> None:
    snap = Snapshot(
        revision=9,
        observed_at=1700000000.25,
        products=(
            ProductCapacity(
                product=H100,
                nodes=3,
                unhealthy_nodes=1,
                total=32,
                allocatable=24,
                in_use=9,
                free=15,
                largest_shape=8,
                histogram=(Bucket(8, 1), Bucket(5, 2)),
                free_cpu_millis=1500,
                free_memory_bytes=2**40,
                free_pods=300,
                labels={"nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.product": H100},
                gpu_memory_mib=81559,
                source="nvml",
                largest_node=8,
            ),
            ProductCapacity("", 1, 0, 0, 0, 0, 0, 0, (Bucket(0, 1),), 1, 2, 3),
        ),
    )
    assert wire.snapshot_from_pb(pb.Snapshot.FromString(wire.snapshot_to_pb(snap).SerializeToString())) == snap
    for shape in (
        PodShape(),
        PodShape(gpus=2, cpu_millis=1, memory_bytes=2, gpu_product="", node_selector=(("b", "2"), ("a", "1"))),
        PodShape(gpus=1, gpu_product=H100, tolerations=(Toleration(), Toleration("k", "Exists", "", "NoSchedule"))),
    ):
        assert wire.shape_from_pb(pb.PodShape.FromString(wire.shape_to_pb(shape).SerializeToString())) == shape
    assert wire.placement_from_pb(wire.placement_to_pb(Placement(False, "why", 0))) == Placement(False, "why", 0)
    assert wire.replicas_from_pb(wire.replicas_to_pb(3, "r")) == (3, "r")
    assert dataclasses.replace(snap, revision=1) != snap


def test_generated_modules_match_the_proto() -> None:
    with tempfile.TemporaryDirectory() as d:
        fresh = codegen.generate(Path(d))
    for name, content in fresh.items():
        committed = (codegen.PACKAGE_DIR / name).read_bytes()
        assert committed == content, f"{name} is stale: run python -m gpufed.devtools.protogen"


# ---- RBAC


def test_rbac_consumers_may_only_get_the_estimator_configmap() -> None:
    docs = manifests.load([REPO / "deploy" / "rbac" / "consumer.yaml"])
    role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "gpufed-consumer-estimator")
    assert role["metadata"]["namespace"] == SYSTEM_NAMESPACE
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"], "resourceNames": [ESTIMATOR_CONFIGMAP]}
    ]
    binding = next(
        d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"] == "gpufed-consumer-estimator"
    )
    assert binding["metadata"]["namespace"] == SYSTEM_NAMESPACE
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": CONSUMER_GROUP}]


def test_rbac_the_controller_reads_the_client_ca_through_the_builtin_role() -> None:
    docs = manifests.load([REPO / "deploy" / "rbac" / "controller.yaml"])
    for d in docs:
        manifests.object_path(d)
    binding = next(d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["namespace"] == "kube-system")
    assert binding["roleRef"]["kind"] == "Role"
    assert binding["roleRef"]["name"] == "extension-apiserver-authentication-reader"
    assert {s["name"] for s in binding["subjects"]} == {"gpufed-controller", "gpufed:controller"}
    # Nodes, pods and tenants (the inventory and who may ask) are already readable cluster-wide...
    cluster_rules = next(d for d in docs if d["kind"] == "ClusterRole")["rules"]
    readable = {r for rule in cluster_rules if {"list", "watch"} <= set(rule["verbs"]) for r in rule["resources"]}
    assert {"nodes", "pods", "tenants"} <= readable
    # ...and its Secret and ConfigMap are written in the gpufed namespace only.
    ns_role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["namespace"] == SYSTEM_NAMESPACE)
    assert {"configmaps", "secrets"} <= set(ns_role["rules"][0]["resources"])
