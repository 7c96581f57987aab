"""What every gpufed CRD shares: the API group and version, the base model, the condition shape.

Owns: `GROUP`, `VERSION` and `API_VERSION` (`gpufed.io/v1alpha1`), `Model` (the pydantic base of
every spec and status: camelCase on the wire, frozen, unknown fields ignored), `Condition` (the
shape of a status condition), `conditions_field` (a status's condition list: a map list keyed by
`type`, so that server-side apply merges conditions per type, described with what makes the kind's
`Ready` condition True), `READY` and the columns every kind shows (`AGE_COLUMN`, `READY_COLUMN`),
and the patterns several kinds validate with (ClusterIDs, non-negative quantities).

Version skew: reading ignores fields it does not know (`extra="ignore"`), so a component one
version behind reads objects a newer peer or controller wrote (new optional fields) instead of
failing; on writes the API server's structural schemas prune fields it does not know. New fields
are always optional with a default, and a field is never removed or retyped within `v1alpha1`.

Does not: define any kind (see `gpufed.apis.peering`, `offloading`, `network`), or build a
condition's value (`gpufed.kube.conditions` does).

Pure: no I/O.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

GROUP = "gpufed.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
#: Non-negative Kubernetes quantity (no sign allowed).
QUANTITY_PATTERN = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+]?[0-9]+)?$"
CLUSTER_ID_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class Model(BaseModel):
    # A kind's or a field type's docstring becomes its description in the generated CRD schema.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


class Condition(Model):
    type: str = Field(description="Condition type, e.g. Authentication or Resources.")
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(description="CamelCase reason a program can match on.")
    message: str = Field(default="", description="What a human needs to know.")
    last_transition_time: dt.datetime | None = None
    observed_generation: int | None = None


#: The condition every kind with a status carries: True when everything the kind needs is done.
READY = "Ready"
#: `kubectl get` columns: the object's age, and its Ready condition.
AGE_COLUMN = ("Age", "date", ".metadata.creationTimestamp")
READY_COLUMN = ("Ready", "string", f'.status.conditions[?(@.type=="{READY}")].status')


def conditions_field(ready_requires: Sequence[str] = (), detail: str = "") -> Any:
    """The `conditions` field of a status: a list keyed by `type` (one condition per type), whose
    description says when `Ready` is True: every type of `ready_requires` True (the first one that is
    not gives Ready its reason), or, without any, as `detail` says."""
    rule = (
        f"{READY} is True when {', '.join(ready_requires)} are all True; otherwise False with the reason "
        "(and message) of the first of them that is not."
        if ready_requires
        else ""
    )
    stamp = "Each condition's observedGeneration is the metadata.generation the controller acted on."
    return Field(
        default_factory=list,
        description=" ".join(t for t in (detail, rule, stamp) if t),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
