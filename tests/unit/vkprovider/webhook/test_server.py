"""The offloading webhook: certificates, its registration, and AdmissionReview answers over HTTP."""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from cryptography import x509
from structlog.testing import capture_logs

from gpufed.kube import rest, servingtls
from tests.unit.fakes import serve
from vkprovider.forge.offloading import NOT_ON_VIRTUAL, TOLERATION
from vkprovider.webhook import server
from vkprovider.webhook.server import Webhook, WebhookServerSettings

OFFLOADING = {
    "metadata": {"name": "offloading", "namespace": "team"},
    "spec": {"podOffloadingStrategy": "Remote"},
}


@pytest.fixture(autouse=True)
def _logs() -> Iterator[None]:
    with capture_logs():
        yield


def review(namespace: str = "team", uid: str = "u-1", obj: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "namespace": namespace,
            "operation": "CREATE",
            "object": obj or {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}},
        },
    }


def test_certificates_for_ip_and_dns_hosts_and_their_renewal() -> None:
    now = dt.datetime.now(dt.UTC)
    m = servingtls.issue("127.0.0.1", days=365, now=now)
    cert = x509.load_pem_x509_certificate(m.cert_pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert cert.issuer == x509.load_pem_x509_certificate(m.ca_pem).subject
    renew = dt.timedelta(days=30)
    assert servingtls.usable(m, "127.0.0.1", renew, now)
    assert not servingtls.usable(m, "10.0.0.1", renew, now), "another address needs another certificate"
    assert not servingtls.usable(m, "127.0.0.1", renew, now + dt.timedelta(days=340)), "renewed 30 days before expiry"
    d = servingtls.issue("gpufed-webhook.gpufed.svc", days=10)
    assert servingtls.usable(d, "gpufed-webhook.gpufed.svc", dt.timedelta(days=1))
    assert not servingtls.usable(servingtls.TLSMaterial(b"x", b"y", b"z"), "127.0.0.1", renew)


def test_webhook_configuration() -> None:
    cfg = server.webhook_configuration("127.0.0.1", 19443, b"CA")
    hook = cfg["webhooks"][0]
    assert cfg["metadata"]["name"] == "gpufed-offloading"
    assert hook["clientConfig"] == {
        "url": "https://127.0.0.1:19443/mutate-pods",
        "caBundle": base64.b64encode(b"CA").decode(),
    }
    assert hook["rules"][0]["operations"] == ["CREATE"] and hook["rules"][0]["resources"] == ["pods"]
    assert hook["namespaceSelector"] == {"matchExpressions": [{"key": "gpufed.io/offloading", "operator": "Exists"}]}
    assert (hook["failurePolicy"], hook["sideEffects"], hook["timeoutSeconds"]) == ("Fail", "None", 5)
    assert hook["reinvocationPolicy"] == "IfNeeded" and hook["admissionReviewVersions"] == ["v1"]
    assert (
        server.webhook_configuration("::1", 1, b"")["webhooks"][0]["clientConfig"]["url"]
        == "https://[::1]:1/mutate-pods"
    )
    # queued Jobs and JobSets: their own path, only those with Kueue's queue label, failing open
    queued = cfg["webhooks"][1]
    assert queued["name"] == "workloads.offloading.gpufed.io"
    assert queued["clientConfig"]["url"] == "https://127.0.0.1:19443/mutate-workloads"
    assert [(r["apiGroups"], r["resources"], r["operations"]) for r in queued["rules"]] == [
        (["batch"], ["jobs"], ["CREATE"]),
        (["jobset.x-k8s.io"], ["jobsets"], ["CREATE"]),
    ]
    assert queued["objectSelector"] == {
        "matchExpressions": [{"key": "kueue.x-k8s.io/queue-name", "operator": "Exists"}]
    }
    assert queued["namespaceSelector"] == hook["namespaceSelector"] and queued["failurePolicy"] == "Ignore"
    in_cluster = server.webhook_configuration("h", 1, b"CA", service=("gpufed", "gpufed-webhook", 443))
    assert [h["clientConfig"]["service"]["path"] for h in in_cluster["webhooks"]] == [
        "/mutate-pods",
        "/mutate-workloads",
    ]


def queued_job_review(gpus: str) -> dict[str, Any]:
    container = {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": gpus}}}
    job = {"metadata": {"name": "train"}, "spec": {"template": {"spec": {"containers": [container]}}}}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u-2", "kind": {"group": "batch", "version": "v1", "kind": "Job"}, "object": job},
    }


async def test_queued_jobs_get_their_pods_fit_affinity() -> None:
    hook = Webhook(None, WebhookServerSettings(port=0))
    async with TestClient(TestServer(hook.app())) as client:
        r = await client.post("/mutate-workloads", json=queued_job_review("8"))
        body = await r.json()
        assert r.status == 200 and body["response"]["uid"] == "u-2" and body["response"]["allowed"]
        ops = json.loads(base64.b64decode(body["response"]["patch"]))
        assert [o["path"] for o in ops] == ["/spec/template/spec/affinity"]
        r = await client.post("/mutate-workloads", json=queued_job_review("1"))
        assert (await r.json())["response"] == {"uid": "u-2", "allowed": True}
        r = await client.post("/mutate-workloads", json=queued_job_review("eight"))  # the API server refuses it
        assert (await r.json())["response"] == {"uid": "u-2", "allowed": True}
        r = await client.post("/mutate-workloads", data=b"{not json")
        assert r.status == 400
        r = await client.post("/mutate-workloads", json={"kind": "AdmissionReview", "request": {}})
        assert r.status == 400


def test_review_response() -> None:
    out = server.review_response(review(), OFFLOADING)["response"]
    assert out["uid"] == "u-1" and out["allowed"] and out["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(out["patch"]))
    assert {"op": "add", "path": "/spec/tolerations", "value": [TOLERATION]} in ops
    assert server.review_response(review(), None)["response"] == {"uid": "u-1", "allowed": True}
    local = {"spec": {"podOffloadingStrategy": "Local"}}
    ops = json.loads(base64.b64decode(server.review_response(review(), local)["response"]["patch"]))
    assert ops[0]["value"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [NOT_ON_VIRTUAL]}
    ]
    bads: list[Any] = [{}, {"kind": "AdmissionReview"}, {"kind": "AdmissionReview", "request": {"uid": ""}}, []]
    for bad in bads:
        with pytest.raises(ValueError):
            server.review_response(bad, None)


async def test_http_answers() -> None:
    hook = Webhook(None, WebhookServerSettings(port=0))
    # As the watch would have filled it (an offloaded "team", a known-not-offloaded "elsewhere"): no API call.
    hook.cache.items.update({"team": OFFLOADING, "elsewhere": None})
    async with TestClient(TestServer(hook.app())) as client:
        r = await client.post("/mutate-pods", json=review())
        body = await r.json()
        assert r.status == 200 and body["kind"] == "AdmissionReview" and body["response"]["patchType"] == "JSONPatch"
        r = await client.post("/mutate-pods", json=review(namespace="elsewhere"))
        assert (await r.json())["response"] == {"uid": "u-1", "allowed": True}
        r = await client.post("/mutate-pods", data=b"{not json")
        assert r.status == 400 and "malformed" in (await r.json())["error"]
        r = await client.post("/mutate-pods", json={"kind": "Pod"})
        assert r.status == 400
        assert (await client.get("/healthz")).status == 200


def test_offloading_cache_ignores_deleting_objects() -> None:
    cache = server.OffloadingCache(None)
    cache.on_event("ADDED", OFFLOADING)
    assert cache.items.get("team") is OFFLOADING
    deleting = {"metadata": {**OFFLOADING["metadata"], "deletionTimestamp": "x"}, "spec": {}}
    cache.on_event("MODIFIED", deleting)
    assert "team" in cache.items and cache.items["team"] is None
    cache.on_event("DELETED", deleting)
    assert "team" not in cache.items
    cache.on_event("ADDED", {"metadata": {"name": "other", "namespace": "x"}})
    assert "x" not in cache.items


def _gpu_pod(labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "w-0",
            "namespace": "team",
            "labels": labels or {},
            "annotations": annotations or {},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "controller": True}],
        },
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
    }


def test_pods_of_a_group_are_gated_and_a_bad_group_size_is_refused() -> None:
    job = {"metadata": {"name": "train", "uid": "j-1"}, "spec": {"parallelism": 4, "completions": 4}}
    out = server.review_response(review(obj=_gpu_pod()), OFFLOADING, job)["response"]
    ops = json.loads(base64.b64decode(out["patch"]))
    assert {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": "gpufed.io/gang"}]} in ops
    # a Job that runs one pod at a time: today's path, no gate
    single = {**job, "spec": {"parallelism": 1}}
    ops = json.loads(
        base64.b64decode(server.review_response(review(obj=_gpu_pod()), OFFLOADING, single)["response"]["patch"])
    )
    assert all("schedulingGates" not in op["path"] for op in ops)
    bad = _gpu_pod({"gpufed.io/pod-group": "ring"}, {"gpufed.io/pod-group-size": "lots"})
    refused = server.review_response(review(obj=bad), OFFLOADING)["response"]
    assert refused["allowed"] is False and "patch" not in refused
    assert "gpufed.io/pod-group-size" in refused["status"]["message"]


async def test_the_job_of_a_pod_is_read_once() -> None:
    hook = Webhook(None, WebhookServerSettings(port=0))
    hook.cache.items.update({"team": OFFLOADING})
    reads: list[tuple[str, str]] = []
    job = {"metadata": {"name": "train", "uid": "j-1"}, "spec": {"parallelism": 2}}

    async def get(_api: Any, path: str, **_: Any) -> dict[str, Any]:
        reads.append(("GET", path))
        return job

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rest, "get", get)
        async with TestClient(TestServer(hook.app())) as client:
            for uid in ("u-1", "u-2"):
                r = await client.post("/mutate-pods", json=review(uid=uid, obj=_gpu_pod()))
                ops = json.loads(base64.b64decode((await r.json())["response"]["patch"]))
                assert {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": "gpufed.io/gang"}]} in ops
    assert reads == [("GET", "/apis/batch/v1/namespaces/team/jobs/train")]


async def test_a_jobsets_pod_is_judged_with_its_jobset_read_once_and_again_when_it_is_a_new_one() -> None:
    hook = Webhook(None, WebhookServerSettings(port=0))
    hook.cache.items.update({"team": OFFLOADING})
    reads: list[str] = []
    jobsets = {
        "js-1": {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": "llm", "uid": "js-1"},
            "spec": {
                "replicatedJobs": [
                    {"name": "leader", "replicas": 1, "template": {"spec": {"parallelism": 1}}},
                    {"name": "workers", "replicas": 3, "template": {"spec": {"parallelism": 1}}},
                ]
            },
        }
    }
    current = ["js-1"]

    async def get(_api: Any, path: str, **_: Any) -> dict[str, Any] | None:
        reads.append(path)
        if "/jobsets/" in path:
            return jobsets.get(current[0])
        return {"metadata": {"name": "train", "uid": "j-1"}, "spec": {"parallelism": 1}}

    def jobset_pod(uid: str) -> dict[str, Any]:
        return _gpu_pod(
            {
                "jobset.sigs.k8s.io/jobset-name": "llm",
                "jobset.sigs.k8s.io/jobset-uid": uid,
                "jobset.sigs.k8s.io/replicatedjob-name": "workers",
                "jobset.sigs.k8s.io/restart-attempt": "0",
            }
        )

    async def annotations(client: TestClient[Any, Any], uid: str) -> dict[str, str]:
        r = await client.post("/mutate-pods", json=review(uid=f"u-{len(reads)}", obj=jobset_pod(uid)))
        ops = json.loads(base64.b64decode((await r.json())["response"]["patch"]))
        return {o["path"]: o["value"] for o in ops if o["path"].startswith("/metadata/annotations/gpufed.io")}

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rest, "get", get)
        async with TestClient(TestServer(hook.app())) as client:
            for _ in range(2):
                marks = await annotations(client, "js-1")
                assert marks["/metadata/annotations/gpufed.io~1gang-size"] == "4"
                assert marks["/metadata/annotations/gpufed.io~1gang-group"] == "jobset-llm-js-1-r0"
            assert reads == ["/apis/jobset.x-k8s.io/v1alpha2/namespaces/team/jobsets/llm"]
            # a JobSet created anew under the same name is read again; one that is gone leaves the Job
            current[0] = "js-2"
            assert await annotations(client, "js-2") == {}
            assert reads[1:] == [
                "/apis/jobset.x-k8s.io/v1alpha2/namespaces/team/jobsets/llm",
                "/apis/batch/v1/namespaces/team/jobs/train",
            ]


def _required(out: dict[str, Any]) -> list[dict[str, Any]]:
    ops = json.loads(base64.b64decode(out["patch"]))
    affinity = next(o["value"] for o in ops if o["path"] == "/spec/affinity")
    terms: list[dict[str, Any]] = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    return terms


def test_a_pod_goes_where_its_claims_keep_their_data() -> None:
    both = {"spec": {"podOffloadingStrategy": "LocalAndRemote", "clusterSelector": None}}
    pin = {"key": "gpufed.io/remote-cluster-id", "operator": "In", "values": ["gpu-a"]}
    # bound on gpu-a: that provider's virtual nodes only (the local alternative goes)
    out = server.review_response(review(), both, places={"data": "gpu-a", "ckpt": "gpu-a"})["response"]
    assert _required(out) == [{"matchExpressions": [pin]}]
    # the consumer's own storage: local nodes only
    out = server.review_response(review(), both, places={"home": None})["response"]
    assert _required(out) == [{"matchExpressions": [NOT_ON_VIRTUAL]}]
    # a Remote namespace cannot honour a local claim: admitted, said at once
    out = server.review_response(review(), OFFLOADING, places={"home": None})["response"]
    assert out["allowed"] and "stays Pending" in out["warnings"][0]
    # data in two clusters: no node reaches both
    out = server.review_response(review(), both, places={"data": "gpu-a", "home": None})["response"]
    assert not out["allowed"] and out["status"]["code"] == 422
    assert "data on gpu-a, home on this cluster" in out["status"]["message"]


def test_a_pod_its_claims_keep_local_is_labelled_for_its_event_and_never_gated() -> None:
    both = {"spec": {"podOffloadingStrategy": "LocalAndRemote", "clusterSelector": None}}
    job = {"metadata": {"name": "train", "uid": "j-1"}, "spec": {"parallelism": 4, "completions": 4}}
    out = server.review_response(review(obj=_gpu_pod(labels={"app": "x"})), both, job, {"home": None})["response"]
    ops = json.loads(base64.b64decode(out["patch"]))
    assert {"op": "add", "path": "/metadata/labels/gpufed.io~1kept-local", "value": "local"} in ops
    assert not any(o["path"].startswith("/spec/schedulingGates") for o in ops), "a group kept local is not gated"
    # no labels at all: the map is added; a Remote namespace says the pod stays Pending
    out = server.review_response(review(), OFFLOADING, places={"home": None})["response"]
    ops = json.loads(base64.b64decode(out["patch"]))
    assert {"op": "add", "path": "/metadata/labels", "value": {"gpufed.io/kept-local": "pending"}} in ops
    # claims on a provider, or none: no label
    for places in ({"data": "gpu-a"}, {}):
        out = server.review_response(review(), both, places=places)["response"]
        ops = json.loads(base64.b64decode(out["patch"])) if "patch" in out else []
        assert not any("kept-local" in json.dumps(o) for o in ops), places
    # a Local namespace offloads nothing: nothing to say
    local = {"spec": {"podOffloadingStrategy": "Local"}}
    out = server.review_response(review(), local, places={"home": None})["response"]
    ops = json.loads(base64.b64decode(out["patch"])) if "patch" in out else []
    assert not any("kept-local" in json.dumps(o) for o in ops)


async def test_claim_places_are_read_from_the_claims_their_volumes_and_classes() -> None:
    async with serve() as (fake, api):
        fake.create("storageclasses", {"metadata": {"name": "gpufed"}, "provisioner": "storage.gpufed.io"})
        fake.create("storageclasses", {"metadata": {"name": "local-ssd"}, "provisioner": "rancher.io/local-path"})

        def claim(name: str, cls: str, volume: str = "") -> None:
            spec: dict[str, Any] = {"storageClassName": cls}
            if volume:
                spec["volumeName"] = volume
            fake.create("persistentvolumeclaims", {"metadata": {"name": name, "namespace": "team"}, "spec": spec})

        claim("fresh", "gpufed")
        claim("bound", "gpufed", "gpufed-u1")
        claim("home", "local-ssd")
        claim("home-bound", "local-ssd", "pv-1")
        fake.create(
            "persistentvolumes",
            {
                "metadata": {"name": "gpufed-u1", "labels": {"gpufed.io/remote-cluster-id": "gpu-a"}},
                "spec": {"csi": {"driver": "storage.gpufed.io"}},
            },
        )
        fake.create("persistentvolumes", {"metadata": {"name": "pv-1"}, "spec": {"hostPath": {"path": "/x"}}})
        vols = [
            {"name": n, "persistentVolumeClaim": {"claimName": n}} for n in ("fresh", "bound", "home", "home-bound")
        ]
        vols.append({"name": "gone", "persistentVolumeClaim": {"claimName": "missing"}})
        vols.append({"name": "odd", "persistentVolumeClaim": {"claimName": "../x"}})
        places = await server.ClaimPlaces(api).lookup("team", {"spec": {"volumes": vols}})
        assert places == {"bound": "gpu-a", "home": None, "home-bound": None}
