"""Claim storage in the grant (peering.grants): decided like the node resources but limited by the
StorageClasses offered (`StorageSupply`), and enforced by the twin namespaces' quotas as
`requests.storage` and one claim per granted pod slot."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpufed.apis.quantity import parse
from peering import grants
from peering.grants import Decision, GrantError, NodeInfo, OtherGrant, Reason, SliceRequest, StorageSupply, TenantPolicy

D = Decimal
GI = parse("1Gi")
NODES = [NodeInfo("a0", {"cpu": D(96), "memory": D(2**40), "pods": D(110), "nvidia.com/gpu": D(8)})]
LOCAL = StorageSupply(("local-disk",), D(200) * GI)
ON_DEMAND = StorageSupply(("standard",), None)


def run(
    storage_gi: int,
    supply: StorageSupply,
    *,
    policy: TenantPolicy | None = None,
    others: list[OtherGrant] | None = None,
    own: dict[str, Decimal] | None = None,
) -> Decision:
    request = SliceRequest({"nvidia.com/gpu": D(2), "storage": D(storage_gi) * GI})
    return grants.decide(
        request,
        nodes=NODES,
        pods=[],
        own_usage=own or {},
        others=others or [],
        policy=policy or TenantPolicy(),
        storage=supply,
    )


def test_storage_is_a_resource_a_slice_may_ask_for() -> None:
    grants.validate(SliceRequest({"storage": D(1)}))
    with pytest.raises(GrantError, match="storage must not be negative"):
        grants.validate(SliceRequest({"storage": D(-1)}))


def test_storage_provisioned_on_demand_is_limited_by_the_policy_alone() -> None:
    d = run(1000, ON_DEMAND)
    assert d.accepted and d.reason is Reason.GRANTED and d.granted["storage"] == 1000 * GI
    assert "storage" not in d.available, "no known limit"
    d = run(100, ON_DEMAND, policy=TenantPolicy(maximum={"storage": 40 * GI}))
    assert d.accepted and d.reason is Reason.PARTIAL and d.granted["storage"] == 40 * GI
    assert "storage: 40Gi of 100Gi (the policy allows at most 40Gi)" in d.message


def test_static_volumes_bound_the_grant_and_other_grants_hold_on_to_theirs() -> None:
    d = run(100, LOCAL)
    assert d.reason is Reason.GRANTED and d.available["storage"] == 200 * GI
    # Another consumer holds 150Gi of storage, 30Gi of it in claims (whose volumes are no longer free).
    others = [OtherGrant({"storage": D(150) * GI}, {"storage": D(30) * GI}, "SOME-GPU")]
    d = run(100, StorageSupply(LOCAL.classes, D(170) * GI), others=others)
    assert d.reason is Reason.PARTIAL and d.granted["storage"] == 50 * GI, "another product's grant still counts"
    assert "storage: 50Gi of 100Gi (only 50Gi free in the offered classes' volumes" in d.message
    d = run(100, StorageSupply(LOCAL.classes, D(170) * GI), others=others, own={"storage": D(60) * GI})
    assert d.granted["storage"] == 100 * GI, "the consumer's own claims count as storage it keeps"


def test_no_offered_class_denies_a_slice_that_asks_for_storage() -> None:
    d = run(10, StorageSupply())
    assert not d.accepted and d.reason is Reason.NO_STORAGE_CLASS and d.granted == {}
    assert "no StorageClass of the provider is offered to this consumer" in d.message
    request = SliceRequest({"nvidia.com/gpu": D(2)})
    plain = grants.decide(request, nodes=NODES, pods=[], own_usage={}, others=[], policy=TenantPolicy())
    assert plain.accepted and "storage" not in plain.granted, "a slice without storage needs no class"


def test_a_grant_allows_one_claim_per_pod_slot_only_with_storage() -> None:
    assert grants.enforced({"pods": D(10), "storage": D(5)})[grants.CLAIMS] == 10
    assert grants.enforced({"pods": D(10)})[grants.CLAIMS] == 0
    assert grants.enforced({"pods": D(10)})["storage"] == 0


def test_claims_count_their_requested_storage_and_one_claim() -> None:
    claim = {"spec": {"resources": {"requests": {"storage": "10Gi"}}}}
    assert grants.claim_requests(claim) == {"storage": 10 * GI, grants.CLAIMS: 1}
    assert grants.claim_requests({"spec": {"resources": {"requests": {"storage": "lots"}}}})["storage"] == 0
    assert grants.claim_requests({}) == {"storage": 0, grants.CLAIMS: 1}


def test_partition_shares_storage_and_claims_without_exceeding_the_grant() -> None:
    grant = grants.enforced({"pods": D(4), "storage": D(100) * GI})
    used = {"a": {"storage": D(70) * GI, grants.CLAIMS: D(1)}, "b": {}}
    out = grants.partition(grant, used)
    assert out["a"]["storage"] + out["b"]["storage"] == 100 * GI
    assert out["a"]["storage"] >= 70 * GI, "a namespace keeps what its claims hold"
    assert out["a"][grants.CLAIMS] + out["b"][grants.CLAIMS] == 4
    out = grants.partition(grants.enforced({"pods": D(4)}), used)
    assert out["b"]["storage"] == 0 and out["b"][grants.CLAIMS] == 0, "no storage grant: no claims"
    assert out["a"]["storage"] == 70 * GI, "claims that exist are held at their usage"


def test_the_quota_names_claim_storage_and_claims() -> None:
    hard = grants.quota_hard({"pods": D(3), "storage": D(40) * GI, grants.CLAIMS: D(3)}, (), tenant=False)
    assert hard["requests.storage"] == "40Gi" and hard["persistentvolumeclaims"] == "3"
    assert "count/persistentvolumeclaims" not in hard
    tenant = grants.quota_hard({"pods": D(3), "storage": D(40) * GI, grants.CLAIMS: D(3)}, (), tenant=True)
    assert tenant["requests.storage"] == tenant["persistentvolumeclaims"] == "0", "control objects only"
