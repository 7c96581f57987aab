"""Generated bad and odd pods: the forge's translators and the offloading webhook.

Owns the properties that
- `forge.pods.remote_pod` turns any API-shaped pod (huge specs, odd and unicode names, missing
  ConfigMaps/Secrets/ServiceAccounts, invalid GPU quantities — the forge passes quantities through,
  the provider's API server refuses them) into a twin that keeps the forge's invariants (origin labels
  that a local label cannot forge, no consumer-bound fields, JSON-serialisable, input untouched) and
  `references` names every ConfigMap/Secret the pod needs, sorted and once;
- `forge.offloading.mutate` either returns JSON-patch operations that apply cleanly and are idempotent,
  or raises ValueError for a malformed pod (documented), never another exception;
- the webhook answers any body with 200 (an AdmissionReview) or 400 (`malformed AdmissionReview`),
  never 500.
Hypothesis runs derandomized with explicit `max_examples`; counts are in docs/reliability.md.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from gpufed.apis.wire import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    ORIGIN_CLUSTER_LABEL,
    ORIGIN_NODE_LABEL,
    ORIGIN_UID_LABEL,
    VIRTUAL_NODE_TAINT,
    VIRTUAL_NODE_TAINT_KEY,
)
from vkprovider.forge import meta, offloading, pods
from vkprovider.forge.tokens import PodIdentity
from vkprovider.webhook.server import Webhook, WebhookServerSettings, review_response

TARGET = meta.Target(consumer="consumer-1a2b3c4d", node="gpufed-gpu-a", namespace="team-consumer-1a2b3c4d")
IDENTITY = PodIdentity("gpufed-token-p", "10.0.0.1", 6443)


def bounded(n: int) -> settings:
    """Deterministic, bounded hypothesis settings: `n` generated cases, no deadline, no database."""
    return settings(
        max_examples=n,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    with capture_logs():
        yield


# ---- API-shaped pods with odd content

_odd = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["", "a", "é-ü", "😀", "a" * 253, "..", "../etc", "kube-api-access-x", "gpufed.io/x", "\u202e"]),
)
_quantity = st.one_of(
    st.sampled_from(["1", "8", "0", "-1", "1.5", "1e99999999", "NaN", "", "64Gi", "eight"]), st.text(max_size=8)
)
_ref = st.fixed_dictionaries({"name": _odd}, optional={"optional": st.booleans()})
_env = st.fixed_dictionaries(
    {"name": _odd},
    optional={
        "value": _odd,
        "valueFrom": st.one_of(
            st.fixed_dictionaries({"configMapKeyRef": st.fixed_dictionaries({"name": _odd, "key": _odd})}),
            st.fixed_dictionaries({"secretKeyRef": st.fixed_dictionaries({"name": _odd, "key": _odd})}),
        ),
    },
)
_mount = st.fixed_dictionaries({"name": _odd, "mountPath": _odd})
_container = st.fixed_dictionaries(
    {"name": _odd, "image": _odd},
    optional={
        "env": st.lists(_env, max_size=2),
        "envFrom": st.lists(
            st.one_of(st.fixed_dictionaries({"configMapRef": _ref}), st.fixed_dictionaries({"secretRef": _ref})),
            max_size=2,
        ),
        "volumeMounts": st.lists(_mount, max_size=2),
        "resources": st.fixed_dictionaries(
            {},
            optional={
                "limits": st.dictionaries(st.sampled_from(["nvidia.com/gpu", "cpu", "memory", "é"]), _quantity),
                "requests": st.dictionaries(st.sampled_from(["nvidia.com/gpu", "cpu", "memory"]), _quantity),
            },
        ),
    },
)
_volume = st.one_of(
    st.fixed_dictionaries({"name": _odd, "configMap": _ref}),
    st.fixed_dictionaries({"name": _odd, "secret": st.fixed_dictionaries({"secretName": _odd})}),
    st.fixed_dictionaries(
        {
            "name": _odd,
            "projected": st.fixed_dictionaries(
                {
                    "sources": st.lists(
                        st.one_of(
                            st.fixed_dictionaries({"configMap": _ref}),
                            st.fixed_dictionaries({"secret": _ref}),
                            st.just({"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}),
                        ),
                        max_size=3,
                    )
                }
            ),
        }
    ),
    st.fixed_dictionaries({"name": _odd, "emptyDir": st.just({})}),
)
_expr = st.fixed_dictionaries(
    {"key": _odd, "operator": st.sampled_from(["In", "NotIn", "Exists"]), "values": st.lists(_odd, max_size=2)}
)
_terms = st.lists(st.fixed_dictionaries({"matchExpressions": st.lists(_expr, max_size=2)}), max_size=2)
_toleration = st.fixed_dictionaries(
    {},
    optional={
        "key": st.one_of(st.just(VIRTUAL_NODE_TAINT_KEY), _odd),
        "operator": st.sampled_from(["Exists", "Equal"]),
        "value": _odd,
        "effect": st.sampled_from(["NoExecute", "NoSchedule", ""]),
        "tolerationSeconds": st.integers(0, 10**6),
    },
)
_spec = st.fixed_dictionaries(
    {"containers": st.lists(_container, min_size=1, max_size=2)},
    optional={
        "initContainers": st.lists(_container, max_size=1),
        "volumes": st.lists(_volume, max_size=3),
        "serviceAccountName": _odd,
        "nodeName": _odd,
        "priorityClassName": _odd,
        "priority": st.integers(),
        "schedulerName": _odd,
        "imagePullSecrets": st.lists(_ref, max_size=2),
        "nodeSelector": st.dictionaries(_odd, _odd, max_size=3),
        "tolerations": st.lists(_toleration, max_size=3),
        "affinity": st.fixed_dictionaries(
            {
                "nodeAffinity": st.fixed_dictionaries(
                    {offloading._REQUIRED: st.fixed_dictionaries({"nodeSelectorTerms": _terms})}
                )
            }
        ),
    },
)
_pod = st.fixed_dictionaries(
    {
        "metadata": st.fixed_dictionaries(
            {"name": _odd, "namespace": _odd, "uid": _odd},
            optional={
                "labels": st.dictionaries(
                    st.one_of(st.just(ORIGIN_CLUSTER_LABEL), st.just(ORIGIN_UID_LABEL), _odd), _odd
                ),
                "annotations": st.dictionaries(_odd, _odd, max_size=3),
            },
        ),
        "spec": _spec,
    }
)


#: A forged origin label, a missing ServiceAccount, an absurd GPU quantity, a token volume.
HOSTILE_POD = {
    "metadata": {"name": "p", "namespace": "n", "uid": "u", "labels": {ORIGIN_CLUSTER_LABEL: "mallory"}},
    "spec": {
        "containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1e99999999"}}}],
        "serviceAccountName": "missing",
        "volumes": [{"name": "kube-api-access-x", "projected": {"sources": []}}],
    },
}


@bounded(50)
@given(_pod, st.booleans(), st.one_of(st.none(), _odd))
@example(HOSTILE_POD, True, None)
def test_remote_pod_keeps_its_invariants(pod: dict[str, Any], with_identity: bool, product: str | None) -> None:
    before = copy.deepcopy(pod)
    target = meta.Target(TARGET.consumer, TARGET.node, TARGET.namespace, gpu_product=product)
    twin = pods.remote_pod(pod, target, IDENTITY if with_identity else None)
    assert pod == before, "the input pod is never modified"
    json.dumps(twin)  # a valid API body
    labels = twin["metadata"]["labels"]
    assert labels[ORIGIN_CLUSTER_LABEL] == TARGET.consumer and labels[ORIGIN_UID_LABEL] == pod["metadata"]["uid"]
    assert labels[MANAGED_BY_LABEL] == MANAGED_BY and labels[ORIGIN_NODE_LABEL] == TARGET.node
    assert twin["metadata"]["namespace"] == TARGET.namespace
    spec = twin["spec"]
    for gone in ("nodeName", "serviceAccountName", "priorityClassName", "priority", "schedulerName"):
        assert gone not in spec
    assert spec["automountServiceAccountToken"] is False
    assert all(t.get("key") != VIRTUAL_NODE_TAINT_KEY for t in spec.get("tolerations") or [])
    if product:
        assert spec["nodeSelector"]["nvidia.com/gpu.product"] == product
    # GPU intent (quantities included, valid or not: the provider's API server judges them) is kept.
    for local, remote in zip(pod["spec"]["containers"], spec["containers"], strict=True):
        assert remote.get("resources") == local.get("resources")
    assert meta.owned_by(twin, TARGET.consumer, pod["metadata"]["uid"])


@bounded(40)
@given(_pod)
def test_references_names_every_configmap_and_secret_once(pod: dict[str, Any]) -> None:
    refs = pods.references(pod)
    assert refs == sorted(refs) and len({(r.kind, r.name) for r in refs}) == len(refs)
    named = json.dumps(pod)
    for ref in refs:
        assert ref.kind in ("ConfigMap", "Secret") and ref.name and json.dumps(ref.name) in named


# ---- the webhook's mutation


def apply_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 add/replace, enough to check that the webhook's operations apply (strictly)."""
    out = copy.deepcopy(doc)
    for op in ops:
        assert op["op"] in ("add", "replace")
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node: Any = out
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if isinstance(node, list):
            assert last == "-" and op["op"] == "add"
            node.append(op["value"])
        else:
            assert (last in node) == (op["op"] == "replace"), op
            node[last] = op["value"]
    return out


_selector = st.one_of(st.none(), st.fixed_dictionaries({"nodeSelectorTerms": _terms}))


@bounded(50)
@given(_pod, st.sampled_from(offloading.STRATEGIES), _selector)
def test_mutate_applies_cleanly_and_is_idempotent(pod: dict[str, Any], strategy: str, selector: Any) -> None:
    ops = offloading.mutate(pod, strategy, selector)
    mutated = apply_patch(pod, ops)
    assert offloading.mutate(mutated, strategy, selector) == [], "a reinvocation changes nothing"
    tolerates = any(offloading._tolerates(t, VIRTUAL_NODE_TAINT) for t in mutated["spec"].get("tolerations") or [])
    assert tolerates or strategy == "Local"


_json: st.SearchStrategy[Any] = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
_hostile_pod = st.one_of(
    _json,
    st.fixed_dictionaries({"spec": _json}),
    st.fixed_dictionaries({"spec": st.fixed_dictionaries({"tolerations": _json})}),
    st.fixed_dictionaries({"spec": st.fixed_dictionaries({"affinity": _json})}),
    st.fixed_dictionaries(
        {"spec": st.fixed_dictionaries({"affinity": st.fixed_dictionaries({"nodeAffinity": _json})})}
    ),
    st.fixed_dictionaries(
        {"spec": st.just({"affinity": {"nodeAffinity": {offloading._REQUIRED: {}}}}).map(copy.deepcopy)}
    ),
)


@bounded(120)
@given(_hostile_pod, st.sampled_from(offloading.STRATEGIES), st.one_of(_selector, _json))
@example(None, "Local", None)
@example({"spec": "x"}, "Remote", None)  # regression: AttributeError 'str' object has no attribute 'get'
@example({"spec": {"tolerations": 5}}, "Remote", None)  # regression: TypeError 'int' object is not iterable
@example({"spec": {"tolerations": ["x"]}}, "LocalAndRemote", None)  # regression: AttributeError
@example({"spec": {"affinity": {"nodeAffinity": []}}}, "Local", None)  # regression: AttributeError
@example({"spec": {}}, "Remote", {"nodeSelectorTerms": [{"matchExpressions": [1]}]})  # regression: TypeError
def test_mutate_raises_only_value_error_on_a_malformed_pod(pod: Any, strategy: str, selector: Any) -> None:
    try:
        ops = offloading.mutate(pod, strategy, selector)
    except ValueError as e:
        assert str(e)
        return
    json.dumps(ops)


def _review(obj: Any, uid: Any = "u-1") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": uid, "kind": {"kind": "Pod"}, "namespace": "team", "object": obj},
    }


_bodies = st.one_of(
    st.binary(max_size=300),
    _json.map(lambda v: json.dumps(v).encode()),
    st.tuples(_hostile_pod, st.one_of(st.just("u-1"), _json)).map(lambda t: json.dumps(_review(*t)).encode()),
    _pod.map(lambda p: json.dumps(_review(p)).encode()),
)
OFFLOADING = {"metadata": {"name": "offloading", "namespace": "team"}, "spec": {"podOffloadingStrategy": "Remote"}}


@bounded(80)
@given(_bodies)
@example(b"[" * 100_000)  # regression: RecursionError from json.loads was a 500
@example(json.dumps(_review({"spec": "x"})).encode())  # regression: AttributeError in mutate was a 500
@example(json.dumps(_review({"spec": {"tolerations": 5}})).encode())  # regression: TypeError was a 500
@example(b"\xff\xfe")
async def test_the_webhook_answers_200_or_400_never_500(body: bytes) -> None:
    hook = Webhook(None, WebhookServerSettings(port=0))
    hook.cache.items["team"] = OFFLOADING  # an offloaded namespace: no API call
    async with TestClient(TestServer(hook.app())) as client:
        r = await client.post("/mutate-pods", data=body, headers={"Content-Type": "application/json"})
        answer = await r.json()
        assert r.status in (200, 400), (r.status, answer)
        if r.status == 400:
            assert answer["error"].startswith("malformed AdmissionReview")
            return
        assert answer["kind"] == "AdmissionReview" and answer["response"]["allowed"] is True
        if "patch" in answer["response"]:
            ops = json.loads(base64.b64decode(answer["response"]["patch"]))
            assert isinstance(ops, list) and ops


@bounded(30)
@given(_pod)
def test_review_response_patches_what_it_is_given(pod: dict[str, Any]) -> None:
    out = review_response(_review(pod), OFFLOADING)["response"]
    ops = json.loads(base64.b64decode(out["patch"])) if "patch" in out else []
    assert offloading.mutate(apply_patch(pod, ops), "Remote", None) == []
