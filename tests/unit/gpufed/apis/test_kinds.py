"""`KINDS` lists every CRD kind the API modules define, once, with a distinct plural."""

from __future__ import annotations

from gpufed.apis import meta, network, offloading, peering
from gpufed.apis.kinds import KINDS


def test_every_kind_is_listed_once() -> None:
    defined = {
        obj
        for module in (peering, offloading, network)
        for obj in vars(module).values()
        if isinstance(obj, type) and issubclass(obj, meta.Model) and "kind" in vars(obj)
    }
    assert set(KINDS) == defined
    assert len({k.plural for k in KINDS}) == len(KINDS) == len(set(KINDS))
    assert {k.scope for k in KINDS} <= {"Cluster", "Namespaced"}
