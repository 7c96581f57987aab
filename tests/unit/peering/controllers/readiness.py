"""What the Ready-condition tests of both peering roles read off the in-memory API server: a new
generation as the API server sets it, an object's conditions, its Ready condition (which must come
first) and the generations its conditions were observed at."""

from __future__ import annotations

from typing import Any

from gpufed.kube import conditions as cond
from tests.unit.fakes import FakeApiServer


def new_generation(server: FakeApiServer, resource: str, namespace: str, name: str, generation: int) -> None:
    """What the API server does on a spec change: a new metadata.generation."""
    server.update(resource, namespace, name, lambda o: o["metadata"].update(generation=generation))


def conditions_of(server: FakeApiServer, resource: str, namespace: str, name: str) -> list[dict[str, Any]]:
    obj = server.get(resource, namespace, name)
    assert obj is not None
    conds: list[dict[str, Any]] = (obj.get("status") or {}).get("conditions") or []
    return conds


def ready_of(conds: list[dict[str, Any]]) -> tuple[str, str]:
    ready = cond.find(conds, "Ready")
    assert ready is not None, conds
    assert conds[0] is ready, "Ready comes first"
    return str(ready["status"]), str(ready["reason"])


def observed_at(conds: list[dict[str, Any]]) -> set[int]:
    return {int(c["observedGeneration"]) for c in conds}
