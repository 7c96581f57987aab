"""`Reflection` against two fake API servers (consumer and provider): create/update/delete, drift,
collisions, policy, namespace start/stop, EndpointSlice translation, Ingress classes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import REGISTRY

from gpufed.apis.wire import ORIGIN_CLUSTER_LABEL
from tests.unit.fakes import FakeApiServer, Request, running, serve
from tests.unit.fakes import until as until_
from vkprovider.remote.reflection import DEFAULT_MAX_OBJECTS, Reflection, ReflectionSettings
from vkprovider.remote.reflection_reports import LOCAL, REMOTE


async def until(predicate: Callable[[], bool], timeout: float = 5.0, what: str = "") -> None:
    """Several watches and a work queue stand between a write and its effect: allow for a loaded machine."""
    await until_(predicate, timeout, what)


CONSUMER = "consumer-1234abcd"
PROVIDER = "gpu-a-5678ef01"
NS = "team"
TWIN = f"team-{CONSUMER}"


class Pair:
    def __init__(self, local: FakeApiServer, remote: FakeApiServer, reflection: Reflection) -> None:
        self.local, self.remote, self.reflection = local, remote, reflection

    def remote_obj(self, plural: str, name: str) -> dict[str, Any] | None:
        return self.remote.get(plural, TWIN, name)

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.local.items("events") if e.get("reason") == reason]


class TenTen:
    """10.244.x.y (provider pod CIDR) <-> 10.71.x.y."""

    def to_local_ip(self, ip: str) -> str:
        return ip.replace("10.244.", "10.71.", 1)

    def to_remote_ip(self, ip: str) -> str:
        return ip.replace("10.71.", "10.244.", 1)


class Refusing(FakeApiServer):
    """A provider whose admission refuses writes to chosen paths (403 with the given message)."""

    def __init__(self) -> None:
        super().__init__()
        #: object path -> the API server's message for a write there.
        self.refuse: dict[str, str] = {}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        message = self.refuse.get(request.path)
        if message is None or request.method not in ("PATCH", "PUT", "POST"):
            return await super().handle(request)
        self.requests.append(Request(request.method, request.path, dict(request.query), request.content_type, None))
        status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403, "reason": "Forbidden"}
        return web.json_response({**status, "message": message}, status=403)


@contextlib.asynccontextmanager
async def pair(
    *,
    resync_s: float = 300.0,
    ns_annotations: dict[str, str] | None = None,
    remote_server: FakeApiServer | None = None,
    max_objects: int = DEFAULT_MAX_OBJECTS,
) -> AsyncIterator[Pair]:
    async with serve() as (local, local_api), serve(remote_server) as (remote, remote_api):
        local.create("namespaces", {"kind": "Namespace", "metadata": {"name": NS, "annotations": ns_annotations or {}}})
        remote.create("namespaces", {"kind": "Namespace", "metadata": {"name": TWIN}})
        settings = ReflectionSettings(CONSUMER, PROVIDER, resync_s=resync_s, max_objects=max_objects)
        reflection = Reflection(local_api, remote_api, settings, TenTen())
        reflection.start_namespace(NS, TWIN)
        async with running(reflection.run()):
            await until(lambda: reflection.ready.is_set())
            yield Pair(local, remote, reflection)


def cm(name: str, data: dict[str, str], namespace: str = NS, **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "data": data,
    }


async def test_config_map_follows_create_update_delete() -> None:
    async with pair() as p:
        p.local.create("configmaps", cm("settings", {"lr": "0.1"}))
        await until(lambda: p.remote_obj("configmaps", "settings") is not None, what="copy created")
        copy = p.remote_obj("configmaps", "settings")
        assert copy is not None
        assert copy["data"] == {"lr": "0.1"}
        assert copy["metadata"]["labels"][ORIGIN_CLUSTER_LABEL] == CONSUMER

        def change(obj: dict[str, Any]) -> None:
            obj["data"] = {"lr": "0.2"}

        p.local.update("configmaps", NS, "settings", change)
        await until(lambda: (p.remote_obj("configmaps", "settings") or {}).get("data") == {"lr": "0.2"})
        p.local.remove("configmaps", NS, "settings")
        await until(lambda: p.remote_obj("configmaps", "settings") is None, what="copy deleted")


async def test_remote_drift_is_reverted_and_a_deleted_copy_recreated() -> None:
    async with pair() as p:
        p.local.create("configmaps", cm("settings", {"lr": "0.1"}))
        await until(lambda: p.remote_obj("configmaps", "settings") is not None)

        def drift(obj: dict[str, Any]) -> None:
            obj["data"] = {"lr": "9.9"}

        p.remote.update("configmaps", TWIN, "settings", drift)
        await until(lambda: (p.remote_obj("configmaps", "settings") or {}).get("data") == {"lr": "0.1"})
        p.remote.remove("configmaps", TWIN, "settings")
        await until(lambda: p.remote_obj("configmaps", "settings") is not None, what="recreated")


async def test_unowned_remote_object_is_left_alone_and_reported_once() -> None:
    async with pair(resync_s=0.2) as p:
        p.remote.create("configmaps", cm("shared", {"owner": "them"}, namespace=TWIN))
        p.local.create("configmaps", cm("shared", {"owner": "us"}))
        await until(lambda: len(p.events("ReflectionCollision")) == 1, what="collision event")
        assert "not created by gpufed" in p.events("ReflectionCollision")[0]["message"]
        # Resyncs (every 0.2 s here) neither repeat the Event (no second POST, no count patch) nor
        # touch the object.
        await asyncio.sleep(0.7)
        posts = [
            r
            for r in p.local.calls("POST", f"/api/v1/namespaces/{NS}/events")
            if r.body.get("reason") == "ReflectionCollision"
        ]
        assert len(posts) == 1
        assert p.events("ReflectionCollision")[0]["count"] == 1
        theirs = p.remote_obj("configmaps", "shared")
        assert theirs is not None and theirs["data"] == {"owner": "them"}
        assert p.remote.calls("PATCH", f"/api/v1/namespaces/{TWIN}/configmaps/shared") == []
        assert p.reflection.writes == 0


async def test_skip_annotation_and_allow_list_mode() -> None:
    async with pair() as p:
        p.local.create("configmaps", cm("private", {"a": "1"}, **{"gpufed.io/skip-reflection": "true"}))
        p.local.create("configmaps", cm("plain", {"a": "1"}))
        p.local.create("configmaps", cm("chosen", {"a": "1"}, **{"gpufed.io/allow-reflection": "true"}))
        await until(lambda: p.remote_obj("configmaps", "plain") is not None)
        await until(lambda: p.remote_obj("configmaps", "chosen") is not None)
        assert p.remote_obj("configmaps", "private") is None

        def allow_list(obj: dict[str, Any]) -> None:
            obj["metadata"]["annotations"] = {"gpufed.io/allow-reflection": "true"}

        p.local.update("namespaces", "", NS, allow_list)
        await until(lambda: p.remote_obj("configmaps", "plain") is None, what="plain removed in allow-list mode")
        assert p.remote_obj("configmaps", "chosen") is not None


async def test_cluster_bound_secrets_and_token_secrets_are_not_touched() -> None:
    async with pair() as p:
        p.local.create(
            "secrets",
            {
                "kind": "Secret",
                "metadata": {"name": "sa-token", "namespace": NS},
                "type": "kubernetes.io/service-account-token",
                "data": {},
            },
        )
        p.local.create(
            "secrets",
            {"kind": "Secret", "metadata": {"name": "creds", "namespace": NS}, "type": "Opaque", "data": {"k": "dg=="}},
        )
        token = {
            "kind": "Secret",
            "metadata": {
                "name": "gpufed-token-p",
                "namespace": TWIN,
                "labels": {ORIGIN_CLUSTER_LABEL: CONSUMER, "gpufed.io/token-for-pod": "p"},
            },
            "data": {"token-0": "eA=="},
        }
        p.remote.create("secrets", token)
        await until(lambda: p.remote_obj("secrets", "creds") is not None)
        assert p.remote_obj("secrets", "sa-token") is None
        # An owned remote Secret with no local counterpart is normally deleted; a token Secret is not ours.
        assert p.remote_obj("secrets", "gpufed-token-p") is not None


async def test_stop_namespace_stops_reflecting() -> None:
    async with pair() as p:
        p.local.create("configmaps", cm("one", {"a": "1"}))
        await until(lambda: p.remote_obj("configmaps", "one") is not None)
        p.reflection.stop_namespace(NS)
        assert p.reflection.namespaces() == {}
        p.local.create("configmaps", cm("two", {"a": "1"}))
        await asyncio.sleep(0.5)
        assert p.remote_obj("configmaps", "two") is None
        p.reflection.start_namespace(NS, TWIN)
        await until(lambda: p.remote_obj("configmaps", "two") is not None, what="reflected after a restart")


async def test_endpoint_slices_follow_their_service_and_are_translated() -> None:
    async with pair() as p:
        slice_ = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "web-abc12",
                "namespace": NS,
                "labels": {
                    "kubernetes.io/service-name": "web",
                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.71.3.4"], "conditions": {"ready": True}, "nodeName": "gpufed-x"}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        }
        p.local.create("endpointslices", slice_, "discovery.k8s.io/v1")
        await asyncio.sleep(0.4)
        assert p.remote.get("endpointslices", TWIN, "web-abc12") is None  # no Service (yet): nothing to serve
        p.local.create(
            "services",
            {
                "kind": "Service",
                "metadata": {"name": "web", "namespace": NS},
                "spec": {"type": "NodePort", "selector": {"app": "web"}, "ports": [{"port": 80, "nodePort": 30080}]},
            },
        )
        await until(lambda: p.remote.get("endpointslices", TWIN, "web-abc12") is not None, what="slice reflected")
        remote_slice = p.remote.get("endpointslices", TWIN, "web-abc12")
        assert remote_slice is not None
        assert remote_slice["endpoints"][0]["addresses"] == ["10.244.3.4"]
        assert "nodeName" not in remote_slice["endpoints"][0]
        assert remote_slice["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] == "reflection.gpufed.io"
        # The Service has its own reflector: it may land just after the slice.
        await until(lambda: p.remote_obj("services", "web") is not None, what="service reflected")
        svc = p.remote_obj("services", "web")
        assert svc is not None and svc["spec"]["type"] == "ClusterIP" and "selector" not in svc["spec"]

        def skip(obj: dict[str, Any]) -> None:
            obj["metadata"]["annotations"] = {"gpufed.io/skip-reflection": "true"}

        p.local.update("services", NS, "web", skip)
        await until(lambda: p.remote.get("endpointslices", TWIN, "web-abc12") is None, what="slice follows service")
        await until(lambda: p.remote_obj("services", "web") is None)


@pytest.mark.parametrize("has_class", [True, False])
async def test_ingress_needs_the_providers_class(has_class: bool) -> None:
    async with pair() as p:
        if has_class:
            p.remote.create(
                "ingressclasses",
                {"kind": "IngressClass", "metadata": {"name": "nginx"}, "spec": {"controller": "x"}},
                "networking.k8s.io/v1",
            )
            await until(lambda: "nginx" in p.reflection._classes, what="the class seen")
        p.local.create(
            "ingresses",
            {
                "kind": "Ingress",
                "metadata": {"name": "web", "namespace": NS},
                "spec": {"ingressClassName": "nginx", "rules": [{"host": "a.example"}]},
            },
            "networking.k8s.io/v1",
        )
        if has_class:
            await until(lambda: p.remote.get("ingresses", TWIN, "web") is not None, what="ingress reflected")
            assert p.events("IngressClassMissing") == []
        else:
            await until(lambda: len(p.events("IngressClassMissing")) == 1, what="missing class reported")
            assert "nginx" in p.events("IngressClassMissing")[0]["message"]
            assert p.remote.get("ingresses", TWIN, "web") is None


async def test_reflecting_event_on_the_namespace_offloading() -> None:
    async with pair() as p:
        await until(lambda: len(p.events("Reflecting")) == 1, what="status event")
        event = p.events("Reflecting")[0]
        assert event["involvedObject"]["kind"] == "NamespaceOffloading"
        assert f"reflecting into {TWIN} on {PROVIDER}" in event["message"]


# ---------------------------------------------------------------- what a provider allows, refuses and floods

NGINX = {"kind": "IngressClass", "metadata": {"name": "nginx"}, "spec": {"controller": "x"}}
SNIPPET = "nginx.ingress.kubernetes.io/configuration-snippet"


def web_ingress(**annotations: str) -> dict[str, Any]:
    return {
        "kind": "Ingress",
        "metadata": {"name": "web", "namespace": NS, "annotations": annotations},
        "spec": {"ingressClassName": "nginx", "rules": [{"host": "web.team.example"}]},
    }


async def test_an_ingress_is_reflected_without_the_annotations_the_provider_refuses_and_says_so() -> None:
    async with pair() as p:
        p.remote.create("ingressclasses", NGINX, "networking.k8s.io/v1")
        await until(lambda: "nginx" in p.reflection._classes, what="the class seen")
        p.local.create(
            "ingresses", web_ingress(**{SNIPPET: "deny all;", "example.com/team": "a"}), "networking.k8s.io/v1"
        )
        await until(lambda: p.remote.get("ingresses", TWIN, "web") is not None, what="ingress reflected")
        copy = p.remote.get("ingresses", TWIN, "web")
        assert copy is not None
        assert SNIPPET not in copy["metadata"]["annotations"]
        assert "example.com/team" not in copy["metadata"]["annotations"]
        await until(lambda: len(p.events("IngressAnnotationsDropped")) == 1, what="the Event")
        (event,) = p.events("IngressAnnotationsDropped")
        assert event["type"] == "Warning" and event["involvedObject"]["kind"] == "Ingress"
        assert SNIPPET in event["message"] and "example.com/team" in event["message"]

        # The provider publishes what its policy allows: that passes from then on.
        p.reflection.set_ingress_annotations(NS, ["example.com/*"])
        await until(
            lambda: "example.com/team" in (p.remote.get("ingresses", TWIN, "web") or {})["metadata"]["annotations"],
            what="the allowed annotation reflected",
        )
        copy = p.remote.get("ingresses", TWIN, "web")
        assert copy is not None and SNIPPET not in copy["metadata"]["annotations"]


async def test_a_refusal_of_the_providers_admission_is_one_event_per_generation_not_a_retry_storm() -> None:
    provider = Refusing()
    path = f"/apis/networking.k8s.io/v1/namespaces/{TWIN}/ingresses/web"
    provider.refuse[path] = (
        "ingresses.networking.k8s.io \"web\" is forbidden: ValidatingAdmissionPolicy 'gpufed-consumer-objects' with "
        "binding 'gpufed-consumer-objects' denied request: Ingress hosts outside the allowed ones are refused "
        "(web.team.example; allowed: ); ask the provider to allow it in Tenant spec.policy.ingressHosts"
    )
    before = REGISTRY.get_sample_value(
        "gpufed_reflection_refusals_total", {"remote_cluster": PROVIDER, "kind": "Ingress"}
    )
    async with pair(resync_s=0.2, remote_server=provider) as p:
        p.remote.create("ingressclasses", NGINX, "networking.k8s.io/v1")
        await until(lambda: "nginx" in p.reflection._classes, what="the class seen")
        p.local.create("ingresses", {**web_ingress(), "metadata": {**web_ingress()["metadata"], "generation": 1}})
        await until(lambda: len(p.events("ReflectionRefused")) == 1, what="the refusal Event")
        (event,) = p.events("ReflectionRefused")
        assert event["type"] == "Warning" and event["involvedObject"]["name"] == "web"
        assert "ValidatingAdmissionPolicy 'gpufed-consumer-objects'" in event["message"]
        assert "ingressHosts" in event["message"]
        await asyncio.sleep(1.0)  # five resyncs
        assert len(p.events("ReflectionRefused")) == 1 and p.events("ReflectionRefused")[0]["count"] == 1
        assert p.events("ReflectionFailed") == []
        # Tried again at each resync (0.2 s), not in a backoff loop of its own.
        assert len(p.remote.calls("PATCH", path)) <= 8
        after = REGISTRY.get_sample_value(
            "gpufed_reflection_refusals_total", {"remote_cluster": PROVIDER, "kind": "Ingress"}
        )
        assert (after or 0) - (before or 0) >= 1

        def next_generation(obj: dict[str, Any]) -> None:
            obj["metadata"]["generation"] = 2
            obj["spec"]["rules"] = [{"host": "other.team.example"}]

        p.local.update("ingresses", NS, "web", next_generation)
        # Reported again (the same message counts on the same Event).
        await until(
            lambda: sum(e["count"] for e in p.events("ReflectionRefused")) == 2, what="the new generation's refusal"
        )
        assert p.remote.get("ingresses", TWIN, "web") is None


async def test_a_provider_flooding_the_twin_namespace_with_config_maps_costs_the_consumer_nothing() -> None:
    async with pair(max_objects=20) as p:
        p.local.create("configmaps", cm("settings", {"lr": "0.1"}))
        await until(lambda: p.remote_obj("configmaps", "settings") is not None, what="reflecting")
        # The provider's own objects: never listed, never held.
        for i in range(200):
            p.remote.create("configmaps", cm(f"theirs-{i}", {"a": "1"}, namespace=TWIN))
        await asyncio.sleep(0.3)
        assert p.reflection.held(REMOTE, "ConfigMap", NS) == 1
        # Objects claiming to be this consumer's copies: past the bound, the kind is no longer watched
        # and what was held is let go.
        for i in range(200):
            forged = cm(f"forged-{i}", {"a": "1"}, namespace=TWIN)
            forged["metadata"]["labels"] = {ORIGIN_CLUSTER_LABEL: CONSUMER}
            p.remote.create("configmaps", forged)
        await until(lambda: len(p.events("ReflectionLimit")) == 1, what="the limit reported")
        assert p.reflection.held(REMOTE, "ConfigMap", NS) == 0
        event = p.events("ReflectionLimit")[0]
        assert "more than 20 ConfigMap" in event["message"] and event["involvedObject"]["kind"] == "NamespaceOffloading"
        ignored = REGISTRY.get_sample_value(
            "gpufed_reflection_ignored_objects_total",
            {"remote_cluster": PROVIDER, "kind": "ConfigMap", "side": "remote"},
        )
        assert (ignored or 0) >= 20
        # Other kinds are still watched; this one's copies are read when written.
        p.local.create("configmaps", cm("more", {"b": "2"}))
        await until(lambda: p.remote_obj("configmaps", "more") is not None, what="still reflecting")

        def change(obj: dict[str, Any]) -> None:
            obj["data"] = {"lr": "0.2"}

        p.local.update("configmaps", NS, "settings", change)
        await until(lambda: (p.remote_obj("configmaps", "settings") or {}).get("data") == {"lr": "0.2"})
        p.local.remove("configmaps", NS, "more")
        await until(lambda: p.remote_obj("configmaps", "more") is None, what="a copy deleted unwatched")
        assert p.reflection.held(REMOTE, "ConfigMap", NS) == 0
        assert p.remote_obj("configmaps", "forged-199") is not None, "objects past the bound are not chased"
        await asyncio.sleep(0.3)
        assert len(p.events("ReflectionLimit")) == 1


async def test_local_objects_beyond_the_bound_are_not_reflected_and_reported_once() -> None:
    async with pair(max_objects=5) as p:
        for i in range(8):
            p.local.create("configmaps", cm(f"c{i}", {"a": "1"}))
        await until(lambda: len(p.remote.items("configmaps", TWIN)) == 5, what="five reflected")
        await until(lambda: len(p.events("ReflectionLimit")) == 1, what="the limit reported")
        assert p.reflection.held(LOCAL, "ConfigMap", NS) == 5
        event = p.events("ReflectionLimit")[0]
        assert event["involvedObject"]["kind"] == "NamespaceOffloading"
        await asyncio.sleep(0.3)
        assert len(p.remote.items("configmaps", TWIN)) == 5


async def test_status_events_go_through_the_bounded_relay() -> None:
    async with pair() as p:
        await until(lambda: len(p.events("Reflecting")) == 1, what="status event")
        for i in range(2000):
            p.reflection.reports.status_event(NS, "Warning", "ReflectionFailed", f"cannot watch: attempt {i}")
        assert p.reflection.events.pending() <= p.reflection.events.limits.capacity
        await p.reflection.events.flushed()
        assert len(p.events("ReflectionFailed")) <= p.reflection.events.limits.burst
