"""The fit affinity of queued workloads: which flavors' labels its terms accept (matched the way
Kueue and the scheduler match required node affinity), what it keeps of the template's own terms,
and that it is given once."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from vkprovider.forge.queued import fit_affinity_patch, pod_gpus, template_paths

KEY = "gpufed.io/pod-gpus-max"


def matches(terms: list[dict[str, Any]], labels: dict[str, str]) -> bool:
    """Required node affinity against a node's (or a flavor's) labels: terms ORed, expressions ANDed."""

    def one(e: dict[str, Any]) -> bool:
        have = labels.get(e["key"])
        op = e["operator"]
        if op == "DoesNotExist":
            return have is None
        if op == "Exists":
            return have is not None
        if op == "In":
            return have in e["values"]
        if op == "Gt":
            return have is not None and have.isdigit() and int(have) > int(e["values"][0])
        raise AssertionError(op)

    return any(all(one(e) for e in t.get("matchExpressions") or []) for t in terms)


def job(*containers: dict[str, Any], affinity: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if affinity is not None:
        spec["affinity"] = affinity
    return {"kind": "Job", "spec": {"template": {"spec": spec}}}


def gpu(n: str, where: str = "limits") -> dict[str, Any]:
    return {"name": "c", "resources": {where: {"nvidia.com/gpu": n}}}


def terms_after(obj: dict[str, Any]) -> list[dict[str, Any]]:
    (op,) = fit_affinity_patch(obj)
    assert op["op"] == "add" and op["path"] == "/spec/template/spec/affinity"
    terms: list[dict[str, Any]] = op["value"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    return terms


@given(st.integers(2, 16), st.integers(1, 16))
def test_a_gpufed_flavor_is_accepted_only_when_its_pool_holds_one_pod(want: int, pool_max: int) -> None:
    terms = terms_after(job(gpu(str(want))))
    host = {"kubernetes.io/hostname": "gpufed-gpu-a"}
    assert matches(terms, {**host, KEY: str(pool_max)}) == (pool_max >= want)
    assert matches(terms, host)  # a flavor that is not gpufed's: Kueue decides as before


def test_the_templates_own_terms_still_hold_in_every_branch() -> None:
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    arch = {"key": "arch", "operator": "In", "values": ["arm"]}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [zone]}, {"matchExpressions": [arch]}]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {}}],
        },
        "podAntiAffinity": {"x": 1},
    }
    obj = job(gpu("4", "requests"), affinity=affinity)
    before = copy.deepcopy(obj)
    terms = terms_after(obj)
    assert obj == before  # pure: the input is not changed
    assert len(terms) == 4
    assert matches(terms, {"zone": "a", KEY: "8"}) and matches(terms, {"arch": "arm"})
    assert not matches(terms, {"zone": "b", KEY: "8"}) and not matches(terms, {"zone": "a", KEY: "2"})
    (op,) = fit_affinity_patch(obj)
    assert op["value"]["podAntiAffinity"] == {"x": 1}
    assert op["value"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]


def test_given_once_and_only_to_multi_gpu_templates() -> None:
    obj = job(gpu("8"))
    (op,) = fit_affinity_patch(obj)
    obj["spec"]["template"]["spec"]["affinity"] = op["value"]
    assert fit_affinity_patch(obj) == []  # re-invoked after another webhook: unchanged
    assert fit_affinity_patch(job(gpu("1"))) == []
    assert fit_affinity_patch(job({"name": "cpu"})) == []
    assert fit_affinity_patch(job(gpu("a lot"))) == []  # the API server refuses the quantity
    assert fit_affinity_patch({"kind": "Pod", "spec": {"containers": [gpu("8")]}}) == []
    assert fit_affinity_patch({"kind": "Job", "spec": None}) == []


def test_gpus_per_pod_count_requests_limits_and_init_containers() -> None:
    assert pod_gpus({"containers": [gpu("2"), gpu("3", "requests")]}) == 5
    assert pod_gpus({"containers": [gpu("1")], "initContainers": [gpu("4")]}) == 4
    assert pod_gpus({}) == 0


def test_every_replicated_job_of_a_jobset_is_sized_on_its_own() -> None:
    def rj(n: str) -> dict[str, Any]:
        return {"template": {"spec": {"template": {"spec": {"containers": [gpu(n)]}}}}}

    jobset = {"kind": "JobSet", "spec": {"replicatedJobs": [rj("1"), rj("8"), rj("2")]}}
    assert [p for p, _ in template_paths(jobset)] == [
        f"/spec/replicatedJobs/{i}/template/spec/template/spec" for i in range(3)
    ]
    ops = fit_affinity_patch(jobset)
    assert [o["path"] for o in ops] == [
        "/spec/replicatedJobs/1/template/spec/template/spec/affinity",
        "/spec/replicatedJobs/2/template/spec/template/spec/affinity",
    ]
    gts = [
        e["values"]
        for o in ops
        for t in o["value"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        for e in t["matchExpressions"]
        if e["operator"] == "Gt"
    ]
    assert gts == [["7"], ["1"]]
