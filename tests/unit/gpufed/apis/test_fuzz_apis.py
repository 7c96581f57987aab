"""Generated bad input for gpufed's CRs: ResourceSlice, NamespaceOffloading, ForeignCluster, Tenant.

Owns the property that hostile or malformed custom resources are refused in the documented way:
the pydantic models raise `ValidationError` (never another exception type), quantities raise
`QuantityError`, a challenge read from a ForeignCluster raises `ValueError`, and the offloading
controller turns a malformed NamespaceOffloading into `phase: Failed` + an `InvalidSpec` condition
without touching any provider (no partial state). Hypothesis runs derandomized with explicit,
small `max_examples` so the file stays fast in CI; counts are in docs/reliability.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from structlog.testing import capture_logs

from gpufed.apis.offloading import NamespaceOffloadingSpec
from gpufed.apis.peering import ChallengeWire, ForeignClusterSpec, ResourceSliceSpec, TenantSpec
from gpufed.apis.pool import SLICE_RESOURCES
from gpufed.apis.quantity import QuantityError, parse
from gpufed.apis.wire import OFFLOADING_LABEL
from peering import handshake
from peering.controllers.consumer import quantities
from tests.unit.peering.controllers.test_offloading import NS_PATH, TWIN_REQ, FakeAPI, controller, world

__all__ = ["world"]  # the fixture, re-used from the offloading controller's tests


def bounded(n: int, *, fixtures: bool = False) -> settings:
    """Deterministic, bounded hypothesis settings: `n` generated cases, no deadline, no database."""
    return settings(
        max_examples=n,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow] if fixtures else [],
    )


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    with capture_logs():
        yield


# Hostile leaves: odd text (unicode, NULs, huge), numbers of every kind, quantities that overflow.
_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        ["", "\x00", "é", "-1", "1e99999999", "1E+999999999", "9" * 5000, "1" + "e" + "9" * 4400, "a" * 300]
    ),
)
_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), _text)
_json: st.SearchStrategy[Any] = st.recursive(
    _leaf, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4), max_leaves=12
)
_quantity = st.one_of(
    _text,
    st.integers(),
    st.from_regex(r"\A[+-]?[0-9]{1,30}(\.[0-9]{0,5})?([eE][+-]?[0-9]{1,12}|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?\Z"),
)
_resources = st.dictionaries(st.sampled_from([*SLICE_RESOURCES, "nvidia.com/GPU", "", "é"]), _quantity, max_size=5)
_cluster_id = st.one_of(st.sampled_from(["gpu-a", "a" * 31, "A", "-a", "a-", "", "a_b", "é"]), _text)


# ---- quantities: the grammar every resource map shares


@bounded(150)
@given(_quantity)
@example("1e99999999")  # regression: decimal.Overflow escaped parse() (and pydantic, and every reconciler)
@example("1e" + "9" * 5000)  # regression: int() of a 5000-digit exponent raised a plain ValueError
@example("9" * 40 + "e999999")
def test_quantity_parse_raises_only_quantity_error(q: Any) -> None:
    try:
        value = parse(q)
    except QuantityError as e:
        assert str(e)
        return
    assert value.is_finite()


@bounded(60)
@given(st.dictionaries(_text, _json, max_size=6))
@example({"cpu": "1e99999999", "nvidia.com/gpu": "1e" + "9" * 5000})
def test_consumer_sums_of_hostile_grants_skip_what_they_cannot_read(amounts: dict[str, Any]) -> None:
    out = quantities(amounts)
    assert set(out) <= set(amounts)
    assert all(isinstance(v, float) for v in out.values())


# ---- the models: ValidationError or a valid object, never another exception


def _validate(model: Any, raw: Any) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        assert e.errors(), "a refusal says what is wrong"
        return None


@bounded(120)
@given(
    st.one_of(
        _json,
        st.fixed_dictionaries(
            {"providerClusterId": _cluster_id, "resources": _resources},
            optional={"gpuProduct": _json, "extra": _json},
        ),
    )
)
@example({"providerClusterId": "gpu-a", "resources": {"nvidia.com/gpu": "1e99999999"}})  # regression (Overflow)
@example({"providerClusterId": "gpu-a", "resources": {"cpu": "-1"}})
def test_resource_slice_spec(raw: Any) -> None:
    spec = _validate(ResourceSliceSpec, raw)
    if spec is not None:
        assert set(spec.resources) <= set(SLICE_RESOURCES)
        assert all(parse(q) >= 0 for q in spec.resources.values())
        assert ResourceSliceSpec.model_validate(spec.model_dump(by_alias=True)) == spec  # round-trips


@bounded(80)
@given(
    st.one_of(
        _json,
        st.fixed_dictionaries(
            {"consumerClusterId": _cluster_id, "publicKey": _text},
            optional={
                "policy": st.one_of(_json, st.fixed_dictionaries({"maxResources": _resources})),
                "authGeneration": st.one_of(st.integers(), _text),
                "answer": st.one_of(_json, st.fixed_dictionaries({"nonce": _text, "csr": _text, "signature": _text})),
            },
        ),
    )
)
@example({"consumerClusterId": "c", "publicKey": "", "policy": {"maxResources": {"memory": "1E+999999999"}}})
def test_tenant_spec(raw: Any) -> None:
    spec = _validate(TenantSpec, raw)
    if spec is not None:
        assert spec.auth_generation >= 1
        assert all(parse(q) >= 0 for q in spec.policy.max_resources.values())


@bounded(80)
@given(
    st.one_of(
        _json,
        st.fixed_dictionaries(
            {"clusterId": _cluster_id, "roles": st.one_of(_json, st.lists(st.sampled_from(["Provider", "x"])))},
            optional={
                "challenge": st.one_of(
                    _json,
                    st.fixed_dictionaries({"provider": _text, "consumer": _text, "nonce": _text, "expiresAt": _text}),
                ),
                "certificate": _json,
                "publicKey": _json,
            },
        ),
    )
)
def test_foreign_cluster_spec_and_its_challenge(raw: Any) -> None:
    spec = _validate(ForeignClusterSpec, raw)
    if spec is None or spec.challenge is None:
        return
    # The consumer controller's parse of the provider's challenge: ValueError becomes InvalidChallenge.
    try:
        ch = handshake.Challenge.from_wire(spec.challenge.model_dump(by_alias=True))
    except ValueError as e:
        assert str(e).startswith("malformed challenge")
    else:
        assert ch.expires_at.tzinfo is not None


@bounded(80)
@given(st.dictionaries(st.sampled_from(["provider", "consumer", "nonce", "expiresAt", "x"]), _json, max_size=5))
@example({"provider": 1, "consumer": "c", "nonce": "", "expiresAt": "2026-01-01T00:00:00Z"})  # regression
@example({"provider": "p", "consumer": "c", "nonce": "AA==", "expiresAt": "2026-13-01T00:00:00Z"})
def test_challenge_from_wire_raises_only_value_error(d: dict[str, Any]) -> None:
    try:
        ch = handshake.Challenge.from_wire(d)
    except ValueError as e:
        assert str(e).startswith("malformed challenge")
        return
    # What it accepts, it can write back and sign for (no AttributeError on a non-string field later).
    assert handshake.Challenge.from_wire(ch.to_wire()) == ch
    assert ChallengeWire.model_validate(ch.to_wire()).provider == ch.provider


_selector = st.one_of(
    _json,
    st.fixed_dictionaries(
        {
            "nodeSelectorTerms": st.lists(
                st.fixed_dictionaries(
                    {
                        "matchExpressions": st.lists(
                            st.fixed_dictionaries(
                                {
                                    "key": _text,
                                    "operator": st.sampled_from(
                                        ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "x"]
                                    ),
                                    "values": st.one_of(_json, st.lists(_text, max_size=3)),
                                }
                            ),
                            max_size=3,
                        )
                    }
                ),
                max_size=3,
            )
        }
    ),
)
_offloading_spec = st.one_of(
    _json,
    st.fixed_dictionaries(
        {},
        optional={
            "podOffloadingStrategy": st.sampled_from(["Local", "Remote", "LocalAndRemote", "remote", "", "é"]),
            "namespaceMappingStrategy": st.sampled_from(["DefaultName", "EnforceSameName", "SelectedName", "x"]),
            "remoteNamespaceName": _text,
            "clusterSelector": _selector,
        },
    ),
)


@bounded(80)
@given(_offloading_spec)
@example(
    {
        "clusterSelector": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "Gt", "values": ["9" * 5000]}]}]
        }
    }
)
def test_namespace_offloading_spec(raw: Any) -> None:
    spec = _validate(NamespaceOffloadingSpec, raw)
    if spec is not None:
        assert spec.cluster_selector.matches({"nvidia.com/gpu.product": "x"}) in (True, False)
        assert spec.twin_name("team") is None or isinstance(spec.twin_name("team"), str)


# ---- the offloading controller: a malformed object becomes a condition, not a dead reconciler


@bounded(40, fixtures=True)
@given(_offloading_spec)
@example({"podOffloadingStrategy": "Elsewhere"})
@example({"namespaceMappingStrategy": "SelectedName"})
@example({"clusterSelector": "everything"})
async def test_offloading_controller_reports_a_malformed_spec(world: dict[str, FakeAPI], raw: Any) -> None:
    for api in world.values():  # a fresh world per example: nothing carried over
        api.objects = {k: v for k, v in api.objects.items() if k == "/api/v1/namespaces/team"}
    world["local"].objects["/api/v1/namespaces/team"] = {"metadata": {"name": "team"}}
    c = controller(world, raw)
    await c.reconcile("team")  # never raises
    local = world["local"].objects
    status = local[NS_PATH].get("status") or {}
    if _validate(NamespaceOffloadingSpec, raw or {}) is None:  # what the controller validates
        assert status["phase"] == "Failed"
        ready = [cond for cond in status["conditions"] if cond["type"] == "Ready"]
        assert ready and ready[0]["reason"] == "InvalidSpec" and ready[0]["message"]
        # no partial state: no finalizer, no namespace label, nothing asked of any provider
        assert not local[NS_PATH]["metadata"].get("finalizers")
        assert OFFLOADING_LABEL not in (local["/api/v1/namespaces/team"]["metadata"].get("labels") or {})
        assert TWIN_REQ not in world["a"].objects and TWIN_REQ not in world["b"].objects
    else:
        assert status.get("phase") in ("Pending", "Ready", "Partial", "Failed", "Terminating")
