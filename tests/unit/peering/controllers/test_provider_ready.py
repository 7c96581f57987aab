"""The provider role's Ready conditions (peering.controllers.provider, tenant_grants): a decided
ResourceSlice's, from Authentication and Resources, and a Tenant's, from Authentication, Namespaces and
PodSecurity; every condition observed at the object's generation. Against the in-memory API server."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gpufed.apis.meta import API_VERSION
from gpufed.kube import conditions as cond
from peering.controllers.identity import Identity
from peering.controllers.provider import ProviderRole
from tests.unit.fakes import serve
from tests.unit.peering.controllers.readiness import conditions_of, new_generation, observed_at, ready_of
from tests.unit.peering.controllers.test_provider_storage import CONSUMER, PROVIDER, SPEC, TNS, TWIN
from tests.unit.peering.controllers.test_provider_storage import _decided as _provider_decided
from tests.unit.peering.controllers.test_provider_storage import _role as _storage_role
from tests.unit.peering.controllers.test_provider_storage import _slice as _provider_slice

# ---- ResourceSlice (provider side: the decision)


async def test_a_granted_slice_is_ready_and_observed_at_its_generation() -> None:
    async with serve() as (server, api):
        role = _storage_role(api)
        _provider_slice(server, role, {"nvidia.com/gpu": "2", "pods": "4"})
        new_generation(server, "resourceslices", TNS, PROVIDER, 2)
        role._on_slice("MODIFIED", server.get("resourceslices", TNS, PROVIDER) or {})
        await role.grants.decide(SPEC, CONSUMER, [TWIN], {})
        st = _provider_decided(server, role)
        assert ready_of(st["conditions"]) == ("True", "Ready")
        assert observed_at(st["conditions"]) == {2}


async def test_a_denied_slice_is_not_ready_with_the_denial_as_its_reason() -> None:
    async with serve() as (server, api):
        role = _storage_role(api)
        _provider_slice(server, role, {"nvidia.com/gpu": "64"})
        await role.grants.decide(
            SPEC.model_copy(update={"policy": SPEC.policy.model_copy(update={"allow_partial": False})}),
            CONSUMER,
            [TWIN],
            {},
        )
        st = _provider_decided(server, role)
        resources = cond.find(st["conditions"], "Resources")
        assert resources is not None and resources["status"] == "False"
        assert ready_of(st["conditions"]) == ("False", resources["reason"])


# ---- Tenant (provider side)


async def test_a_refused_tenant_is_not_ready_and_says_why() -> None:
    async with serve() as (server, api):
        server.create(
            "tenants",
            {
                "metadata": {"name": "someone-else", "generation": 2},
                "spec": {"consumerClusterId": CONSUMER, "publicKey": "k"},
            },
            api_version=API_VERSION,
        )
        await ProviderRole(api, Identity(PROVIDER, "", Ed25519PrivateKey.generate())).reconcile("someone-else")
        conds = conditions_of(server, "tenants", "", "someone-else")
        assert ready_of(conds) == ("False", "InvalidTenant")
        assert observed_at(conds) == {2}
