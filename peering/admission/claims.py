"""The ValidatingAdmissionPolicy `gpufed-consumer-claims` and its binding (`claims_policy`,
`claims_binding`), for the PersistentVolumeClaims a consumer identity writes into its namespaces.

A claim must name one of the StorageClasses offered there (OFFERED_STORAGE_CLASSES_ANNOTATION,
empty without a storage grant: then every claim is refused, saying so) and ask only for access
modes offered for that class (OFFERED_STORAGE_ACCESS_MODES_ANNOTATION, `<class>:<mode>` pairs). It
must not choose its volume: no `spec.volumeName` (binding to an existing PersistentVolume, which may
hold another tenant's data; on update it may not change, so the provider's binder still sets it),
no `spec.selector` (picking volumes by their labels), no `spec.dataSource` or `spec.dataSourceRef`
(cloning a claim or restoring a snapshot, possibly another tenant's). The grant's ResourceQuota
limits the claims' number and total size (`peering.grants.quota_hard`).

Writes by anyone else (the provider's controllers and administrators, kube-controller-manager's
binder) are not matched: the policy applies to the consumer group only, as the objects policy does.

Does not: decide which classes are offered (`peering.storage`, projected onto the namespaces by
`peering.podsecurity.namespace_metadata`), or apply anything (peering.controllers.tenant_namespaces does).
"""

from __future__ import annotations

from typing import Any

from gpufed.apis.wire import (
    OFFERED_STORAGE_ACCESS_MODES_ANNOTATION,
    OFFERED_STORAGE_CLASSES_ANNOTATION,
)
from peering.admission.cel import binding, consumer_policy, csv_list, namespace_variables, rule
from peering.podsecurity import CLAIMS_POLICY_NAME

#: Where a refusal sends the consumer: the storage grant it asks for and the provider's policy.
GRANT_HINT = "ask for storage with `gpufed peer --storage`; the provider chooses the classes in Tenant spec.policy"
_CLASS = "object.spec.?storageClassName.orValue('')"
_MODES = "object.spec.?accessModes.orValue([])"
_VOLUME = "object.spec.?volumeName.orValue('')"
#: The volume name a claim may carry: none when created; on update, the one it has (the binder's).
_KEPT_VOLUME = "(request.operation == 'UPDATE' ? oldObject.spec.?volumeName.orValue('') : '')"
_NONE_OFFERED = "variables.storageClasses.size() == 0"
_OFFERED = "variables.storageClasses.join(', ')"


def _claims_validations() -> list[dict[str, str]]:
    """The validations; those about the class each hold when an earlier one already refuses the
    claim, so that a refusal names one cause."""
    mode_ok = f"({_CLASS} + ':' + m) in variables.storageModes"
    return [
        rule(
            f"!({_NONE_OFFERED})",
            f"'PersistentVolumeClaims are refused in namespace ' + request.namespace + ': this consumer has no "
            f"storage grant here (no StorageClass is offered); {GRANT_HINT}'",
            f"PersistentVolumeClaims are refused: this consumer has no storage grant here; {GRANT_HINT}",
        ),
        rule(
            f"{_NONE_OFFERED} || {_CLASS} != ''",
            f"'a claim must name one of the offered StorageClasses in spec.storageClassName (offered: ' + {_OFFERED} "
            "+ ')'",
            "a claim must name one of the offered StorageClasses in spec.storageClassName",
        ),
        rule(
            f"{_NONE_OFFERED} || {_CLASS} == '' || {_CLASS} in variables.storageClasses",
            f"'StorageClass ' + {_CLASS} + ' is not offered to this consumer in namespace ' + request.namespace + "
            f"' (offered: ' + {_OFFERED} + '); {GRANT_HINT}'",
            f"the claim's StorageClass is not offered to this consumer; {GRANT_HINT}",
        ),
        rule(
            f"!({_CLASS} in variables.storageClasses) || {_MODES}.all(m, {mode_ok})",
            f"'access modes ' + {_MODES}.filter(m, !({mode_ok})).join(', ') + ' are not offered for StorageClass ' + "
            f"{_CLASS} + ' (offered: ' + variables.storageModes.filter(p, p.startsWith({_CLASS} + ':'))"
            f".map(p, p.substring({_CLASS}.size() + 1)).join(', ') + ')'",
            "an access mode that is not offered for the claim's StorageClass is refused",
        ),
        rule(
            f"{_VOLUME} == {_KEPT_VOLUME}",
            f"'spec.volumeName ' + {_VOLUME} + ' is refused: a claim of a consumer may not choose its "
            "PersistentVolume (the provider binds or provisions one)'",
            "spec.volumeName is refused: a claim of a consumer may not choose its PersistentVolume",
        ),
        rule(
            "!has(object.spec.selector)",
            "'spec.selector is refused: a claim of a consumer may not pick PersistentVolumes by their labels'",
            "spec.selector is refused: a claim of a consumer may not pick PersistentVolumes by their labels",
        ),
        rule(
            "!has(object.spec.dataSource) && !has(object.spec.dataSourceRef)",
            "'spec.dataSource and spec.dataSourceRef are refused (' + "
            "(has(object.spec.dataSourceRef) ? object.spec.dataSourceRef : object.spec.dataSource).kind + ' ' + "
            "(has(object.spec.dataSourceRef) ? object.spec.dataSourceRef : object.spec.dataSource).name + "
            "'): a claim of a consumer may not be filled from another claim or a snapshot'",
            "spec.dataSource and spec.dataSourceRef are refused: a claim of a consumer may not be filled from "
            "another claim or a snapshot",
        ),
    ]


def claims_policy(consumer_group: str) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy for the PersistentVolumeClaims a consumer identity (a member of
    `consumer_group`) writes into its namespaces."""
    return consumer_policy(
        CLAIMS_POLICY_NAME,
        consumer_group,
        [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["persistentvolumeclaims"],
            }
        ],
        _claims_validations(),
        [
            *namespace_variables(),
            {"name": "storageClasses", "expression": csv_list(OFFERED_STORAGE_CLASSES_ANNOTATION)},
            {"name": "storageModes", "expression": csv_list(OFFERED_STORAGE_ACCESS_MODES_ANNOTATION)},
        ],
    )


def claims_binding() -> dict[str, Any]:
    """Binds the claims policy to every namespace a consumer has on this provider."""
    return binding(CLAIMS_POLICY_NAME)
