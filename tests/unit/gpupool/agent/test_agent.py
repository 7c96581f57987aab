"""The GPU node agent (gpupool.agent): NvmlReader against recorded NVML sessions, the labels and
annotations of each reading, the agent against an in-memory API server, the CLI's flag errors,
the RBAC file, and the real NvmlReader on this machine (no NVIDIA driver: it must say so, not raise).

Recordings (tests/unit/data/nvml/*.json) map each pynvml call, written `fn(arg,...)` with device
handles named `gpu0`, `gpu0/mig1`, to its answer: a plain value, `{"handle": name}`,
`{"struct": fields}` or `{"error": "<suffix of pynvml's NVMLError_ class>"}`. `FakePynvml`
answers from one (constants and error classes are the real pynvml's) and fails on any call that is
not in it; `RecordingPynvml` wraps a pynvml module and writes what it answered in the same format
(on a GPU node: `python -m tests.unit.gpupool.agent.test_agent OUT.json`). `h200-recorded` was recorded
so on a real H200 node (tests/device/run.sh, which also runs `gpufed gpu-agent --once` there against
real NVML); the others were written in that format from NVML's documented answers and the products'
real figures, for layouts (MIG, faults, mixed products) no GPU node at hand had.
"""

from __future__ import annotations

import asyncio
import ctypes.util
import dataclasses
import functools
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
from typer.testing import CliRunner

from gpufed.apis.wire import (
    GPU_HEALTH_ANNOTATION,
    GPU_HEALTH_REASON_ANNOTATION,
    GPU_HEALTHY,
    GPU_SOURCE_ANNOTATION,
    GPU_UNHEALTHY,
)
from gpufed.kube import manifests
from gpupool.agent import labels as gl
from gpupool.agent.agent import GPUAgent, GPUAgentError, GPUAgentSettings
from gpupool.agent.nvml import GPUInfo, NodeGPUReport, NvmlReader, cuda_version, mig_profile_name
from tests.device import agent_on_nvml as device_check
from tests.paths import REPO, UNIT_DATA
from tests.unit.fakes import FakeApiServer, running, serve, until

DATA = UNIT_DATA / "nvml"
RECORDINGS = ("h100x8", "h200-recorded", "a100x4-mig", "ecc-error", "workstation-mixed", "no-library")
NODE = "gpu-node-1"
NODE_PATH = f"/api/v1/nodes/{NODE}"


# ---------------------------------------------------------------------------------------- the fake


def recording(name: str) -> dict[str, Any]:
    calls: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text())["calls"]
    return calls


def _answer(answer: Any) -> Any:
    if isinstance(answer, dict):
        if "error" in answer:
            raise getattr(pynvml, f"NVMLError_{answer['error']}")()
        if "handle" in answer:
            return answer["handle"]
        if "struct" in answer:
            return SimpleNamespace(**answer["struct"])
    return answer


class FakePynvml:
    """pynvml answering from a recording; `made` lists the calls in order."""

    def __init__(self, calls: Mapping[str, Any]) -> None:
        self.answers = dict(calls)
        self.made: list[str] = []

    def __getattr__(self, name: str) -> Any:
        real = getattr(pynvml, name)  # the reader may only use what pynvml has
        if not name.startswith("nvml"):
            return real  # NVML_* constants and NVMLError classes: exactly pynvml's
        return functools.partial(self._call, name)

    def _call(self, fn: str, *args: Any) -> Any:
        key = f"{fn}({','.join(str(a) for a in args)})"
        self.made.append(key)
        if key not in self.answers:
            raise AssertionError(f"NVML call {key} is not in the recording")
        return _answer(self.answers[key])


class RecordingPynvml:
    """Wraps a pynvml module; `calls` is what it answered, in FakePynvml's format."""

    HANDLES = ("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetMigDeviceHandleByIndex")

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.calls: dict[str, Any] = {}
        self._names: dict[int, str] = {}
        self._keep: list[Any] = []  # handles stay alive, so their ids stay theirs

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.nvml, name)
        if not name.startswith("nvml"):
            return attr

        def call(*args: Any) -> Any:
            key = f"{name}({','.join(self._arg(a) for a in args)})"
            try:
                out = attr(*args)
            except self.nvml.NVMLError as e:
                self.calls[key] = {"error": type(e).__name__.removeprefix("NVMLError_")}
                raise
            self.calls[key] = self._encode(name, args, out)
            return out

        return call

    def _arg(self, a: Any) -> str:
        return str(a) if isinstance(a, int) else self._names.get(id(a), str(a))

    def _encode(self, name: str, args: tuple[Any, ...], out: Any) -> Any:
        if name in self.HANDLES:
            label = f"gpu{args[0]}" if name == self.HANDLES[0] else f"{self._arg(args[0])}/mig{args[1]}"
            self._names[id(out)] = label
            self._keep.append(out)
            return {"handle": label}
        if hasattr(out, "_fields_"):  # a ctypes structure
            return {"struct": {f[0]: getattr(out, f[0]) for f in out._fields_}}
        if isinstance(out, SimpleNamespace):
            return {"struct": vars(out)}
        if isinstance(out, bytes):
            return out.decode()
        return list(out) if isinstance(out, tuple) else out


def read(name: str) -> tuple[NodeGPUReport, FakePynvml]:
    fake = FakePynvml(recording(name))
    return NvmlReader(fake).read(), fake


def uuid(prefix: str, i: int) -> str:
    return f"GPU-{prefix}-{i:04d}-4c2e-9a51-3f6b2d8e{i:04x}"


# ---------------------------------------------------------------------------------------- the reader


@pytest.mark.parametrize("name", RECORDINGS)
def test_the_reader_makes_exactly_the_recorded_calls(name: str) -> None:
    """Re-recording through the fake reproduces each file: the reader makes every recorded call,
    once, and no other (so the recordings cannot go stale)."""
    recorder = RecordingPynvml(FakePynvml(recording(name)))
    NvmlReader(recorder).read()
    assert recorder.calls == recording(name)


def test_h100x8() -> None:
    report, fake = read("h100x8")
    assert (report.driver, report.cuda, report.nvml_error) == ("550.54.15", "12.4", None)
    assert report.devices == tuple(
        GPUInfo(
            index=i,
            name="NVIDIA H100 80GB HBM3",
            uuid=uuid("5d5b3d6c", i),
            memory_mib=81559,
            mig_enabled=False,
            mig_pending=False,
            mig_devices=(),
            ecc_uncorrected=0,
            retired_pages_pending=None,  # Hopper repairs memory by row remapping only
            remap_pending=False,
            remap_failed=False,
        )
        for i in range(8)
    )
    assert fake.made[0] == "nvmlInit()" and fake.made[-1] == "nvmlShutdown()"


def test_a100_with_mig_counts_mig_devices_by_profile() -> None:
    report, _ = read("a100x4-mig")
    d = report.devices
    assert report.cuda == "12.2" and all(x.memory_mib == 40960 for x in d)
    assert (d[0].mig_enabled, d[0].mig_devices) == (True, (("1g.5gb", 3), ("3g.20gb", 1)))
    assert (d[1].mig_enabled, d[1].mig_devices) == (True, (("1c.3g.20gb", 3), ("3g.20gb", 1)))
    assert (d[2].mig_enabled, d[2].mig_pending, d[2].mig_devices) == (False, False, ())
    assert (d[3].mig_enabled, d[3].mig_pending, d[3].mig_devices) == (False, True, ())
    assert all(x.mig_capable for x in d)


def test_ecc_errors_and_a_lost_gpu() -> None:
    report, _ = read("ecc-error")
    bad, lost = report.devices[2], report.devices[3]
    assert (bad.ecc_uncorrected, bad.remap_pending, bad.remap_failed, bad.error) == (2, True, False, None)
    assert lost.error == "GPU is lost [NVMLError_GpuIsLost]"
    assert (lost.name, lost.uuid, lost.memory_mib, lost.ecc_uncorrected) == (
        "NVIDIA A100 80GB PCIe",
        uuid("e0c1ec77", 3),
        None,
        None,
    )
    assert [x.error for x in report.devices[:2]] == [None, None]


def test_not_supported_is_unknown_never_a_failure() -> None:
    report, _ = read("workstation-mixed")
    rtx, a6000 = report.devices
    assert (report.driver, report.cuda, report.nvml_error) == ("550.107.02", None, None)
    assert (rtx.name, rtx.memory_mib, rtx.error) == ("NVIDIA GeForce RTX 4090", 24564, None)
    assert (rtx.mig_enabled, rtx.mig_capable, rtx.ecc_uncorrected, rtx.retired_pages_pending, rtx.remap_failed) == (
        None,
        False,
        None,
        None,
        None,
    )
    assert (a6000.ecc_uncorrected, a6000.remap_failed, a6000.memory_mib) == (0, False, 49140)


def test_nvml_that_cannot_start_is_reported_not_raised() -> None:
    report, fake = read("no-library")
    assert report.devices == () and report.driver is None
    assert report.nvml_error == (
        "NVML cannot start: NVML Shared Library Not Found [NVMLError_LibraryNotFound]: no NVIDIA driver on this "
        "node, or libnvidia-ml.so.1 not mounted into the container"
    )
    assert fake.made == ["nvmlInit()"], "nothing is called, not even nvmlShutdown, when nvmlInit failed"


def test_a_node_wide_failure_is_reported_and_nvml_shut_down() -> None:
    calls = recording("h100x8")
    calls["nvmlDeviceGetCount()"] = {"error": "Unknown"}
    fake = FakePynvml(calls)
    report = NvmlReader(fake).read()
    assert report.nvml_error == "NVML failed: Unknown Error [NVMLError_Unknown]" and report.devices == ()
    assert fake.made[-1] == "nvmlShutdown()"


def test_the_real_reader_on_this_machine_reports_instead_of_raising() -> None:
    report = NvmlReader().read()
    if ctypes.util.find_library("nvidia-ml") is None:
        assert report.devices == ()
        assert report.nvml_error is not None and "NVMLError_LibraryNotFound" in report.nvml_error
    else:  # a machine with a driver: a reading or a reason, never an exception
        assert report.nvml_error is not None or report.driver is not None


@pytest.mark.parametrize(
    ("gi", "ci", "mb", "total_mib", "name"),
    [
        (1, 1, 4864, 40960, "1g.5gb"),  # A100 40GB
        (2, 2, 9984, 40960, "2g.10gb"),
        (3, 3, 20096, 40960, "3g.20gb"),
        (7, 7, 40192, 40960, "7g.40gb"),  # plain rounding of 39.25 GiB would say 39gb
        (3, 1, 20096, 40960, "1c.3g.20gb"),
        (1, 1, 9856, 81559, "1g.10gb"),  # H100 80GB
        (7, 7, 80384, 81559, "7g.80gb"),
        (1, 1, 4864, 0, "1g.5gb"),  # parent memory unknown: the device's own
    ],
)
def test_mig_profile_names_round_like_nvidia(gi: int, ci: int, mb: int, total_mib: int, name: str) -> None:
    assert mig_profile_name(gi, ci, mb, total_mib * 1024 * 1024) == name


def test_cuda_version() -> None:
    assert (cuda_version(12040), cuda_version(11080), cuda_version(13000)) == ("12.4", "11.8", "13.0")


# ---------------------------------------------------------------------------------------- labels and annotations


H100_LABELS = {
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.memory": "81559",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/mig.capable": "true",
    "nvidia.com/cuda.driver-version.full": "550.54.15",
    "nvidia.com/cuda.driver-version.major": "550",
    "nvidia.com/cuda.driver-version.minor": "54",
    "nvidia.com/cuda.driver-version.revision": "15",
    "nvidia.com/cuda.runtime-version.full": "12.4",
    "nvidia.com/cuda.runtime-version.major": "12",
    "nvidia.com/cuda.runtime-version.minor": "4",
}
H100_ANNOTATIONS: dict[str, str | None] = {
    "gpufed.io/gpu-source": "nvml",
    "gpufed.io/gpu-source-reason": None,
    "gpufed.io/gpu-health": "Healthy",
    "gpufed.io/gpu-health-reason": (
        "8 GPU(s) checked by NVML: no uncorrectable ECC errors, no failed or pending memory repairs"
    ),
    "gpufed.io/gpu-mig": None,
    "gpufed.io/gpu-products": None,
}


def test_h100_labels_and_annotations() -> None:
    pub = gl.desired(read("h100x8")[0], {}, {})
    assert pub.labels == H100_LABELS
    assert pub.annotations == H100_ANNOTATIONS
    assert set(pub.annotations) == set(gl.OWNED_ANNOTATIONS)


def test_a_real_h200_nodes_recording() -> None:
    """What a real H200 node's NVML answered gives the labels that `gpufed gpu-agent --once` published
    there (tests/device/run.sh), which nvidia-smi confirmed: 1 GPU, 143771 MiB, driver 580.159.04."""
    report, _ = read("h200-recorded")
    assert (report.driver, report.cuda, report.nvml_error) == ("580.159.04", "13.0", None)
    assert report.devices == (
        GPUInfo(
            index=0,
            name="NVIDIA H200",
            uuid="GPU-7f6ef788-e942-6471-d97c-6094d6f497f2",
            memory_mib=143771,
            mig_enabled=False,
            mig_pending=False,
            mig_devices=(),
            ecc_uncorrected=0,
            retired_pages_pending=None,
            remap_pending=False,
            remap_failed=False,
        ),
    )
    pub = gl.desired(report, {}, {})
    assert pub.labels == {
        "nvidia.com/gpu.product": "NVIDIA-H200",
        "nvidia.com/gpu.memory": "143771",
        "nvidia.com/gpu.count": "1",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/cuda.driver-version.full": "580.159.04",
        "nvidia.com/cuda.driver-version.major": "580",
        "nvidia.com/cuda.driver-version.minor": "159",
        "nvidia.com/cuda.driver-version.revision": "04",
        "nvidia.com/cuda.runtime-version.full": "13.0",
        "nvidia.com/cuda.runtime-version.major": "13",
        "nvidia.com/cuda.runtime-version.minor": "0",
    }
    assert pub.annotations == {
        **H100_ANNOTATIONS,
        "gpufed.io/gpu-health-reason": (
            "1 GPU(s) checked by NVML: no uncorrectable ECC errors, no failed or pending memory repairs"
        ),
    }


def test_mig_layout_is_an_annotation() -> None:
    pub = gl.desired(read("a100x4-mig")[0], {}, {})
    assert pub.labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert (pub.labels["nvidia.com/gpu.memory"], pub.labels["nvidia.com/gpu.count"]) == ("40960", "4")
    assert pub.labels["nvidia.com/mig.capable"] == "true"
    assert "nvidia.com/mig.strategy" not in pub.labels
    assert json.loads(pub.annotations[gl.GPU_MIG_ANNOTATION] or "") == {
        "0": {"1g.5gb": 3, "3g.20gb": 1},
        "1": {"1c.3g.20gb": 3, "3g.20gb": 1},
    }
    assert pub.annotations[GPU_HEALTH_ANNOTATION] == GPU_HEALTHY


def test_mig_devices_unreadable_are_null_in_the_annotation() -> None:
    report = NodeGPUReport(devices=(GPUInfo(0, "NVIDIA A100-SXM4-40GB", "GPU-x", 40960, True, True, None),))
    assert gl.mig_annotation(report) == '{"0":null}'


def test_uncorrectable_errors_and_lost_gpus_make_the_node_unhealthy() -> None:
    pub = gl.desired(read("ecc-error")[0], {}, {})
    assert pub.annotations[GPU_HEALTH_ANNOTATION] == GPU_UNHEALTHY
    assert pub.annotations[GPU_HEALTH_REASON_ANNOTATION] == (
        f"GPU 2 ({uuid('e0c1ec77', 2)}): 2 uncorrectable ECC error(s) since the driver loaded; "
        f"GPU 2 ({uuid('e0c1ec77', 2)}): row remapping pending (reset the GPU); "
        f"GPU 3 ({uuid('e0c1ec77', 3)}): NVML query failed: GPU is lost [NVMLError_GpuIsLost]"
    )
    assert pub.labels["nvidia.com/gpu.count"] == "4", "the lost GPU still counts: the device plugin decides"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"remap_failed": True}, "row remapping failed (memory cannot be repaired)"),
        ({"retired_pages_pending": True}, "page retirement pending (reset the GPU)"),
        ({"ecc_uncorrected": 1}, "1 uncorrectable ECC error(s)"),
    ],
)
def test_each_memory_fault_is_unhealthy(change: dict[str, Any], words: str) -> None:
    healthy = GPUInfo(1, "NVIDIA A100 80GB PCIe", "GPU-1", 81920, False, False, (), 0, False, False, False)
    verdict = gl.judge(NodeGPUReport(devices=(dataclasses.replace(healthy, **change),)))
    assert verdict.status == GPU_UNHEALTHY and verdict.reason == f"GPU 1 (GPU-1): {words}" + (
        " since the driver loaded" if "ECC" in words else ""
    )
    assert gl.judge(NodeGPUReport(devices=(healthy,))).status == GPU_HEALTHY


def test_mixed_products_and_unknown_checks() -> None:
    pub = gl.desired(read("workstation-mixed")[0], {}, {})
    assert pub.labels == {
        "nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-4090",  # the first GPU's, as GFD does
        "nvidia.com/gpu.memory": "24564",
        "nvidia.com/gpu.count": "2",
        "nvidia.com/mig.capable": "false",
        "nvidia.com/cuda.driver-version.full": "550.107.02",
        "nvidia.com/cuda.driver-version.major": "550",
        "nvidia.com/cuda.driver-version.minor": "107",
        "nvidia.com/cuda.driver-version.revision": "02",
    }
    assert json.loads(pub.annotations[gl.GPU_PRODUCTS_ANNOTATION] or "") == {
        "NVIDIA-GeForce-RTX-4090": 1,
        "NVIDIA-RTX-A6000": 1,
    }
    assert pub.annotations[GPU_HEALTH_ANNOTATION] == GPU_HEALTHY
    assert pub.annotations[GPU_HEALTH_REASON_ANNOTATION] == (
        "2 GPU(s) checked by NVML: no uncorrectable ECC errors, no failed or pending memory repairs; "
        "ECC not reported by GPU 0; memory repair state not reported by GPU 0"
    )


def test_without_nvml_only_annotations_say_so() -> None:
    report = read("no-library")[0]
    pub = gl.desired(report, {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, {})
    assert pub.labels == {}
    assert pub.annotations == {
        "gpufed.io/gpu-source": "labels",
        "gpufed.io/gpu-source-reason": report.nvml_error,
        "gpufed.io/gpu-mig": None,
        "gpufed.io/gpu-products": None,
        "gpufed.io/gpu-health": "Healthy",
        "gpufed.io/gpu-health-reason": "NVML unavailable: health not checked",
    }
    kept = gl.desired(report, {}, {GPU_HEALTH_ANNOTATION: GPU_UNHEALTHY})
    assert GPU_HEALTH_ANNOTATION not in kept.annotations and GPU_HEALTH_REASON_ANNOTATION not in kept.annotations


def test_where_gfd_runs_its_labels_are_left_alone() -> None:
    pub = gl.desired(read("h100x8")[0], {gl.GFD_TIMESTAMP_LABEL: "1700000000"}, {})
    assert pub.labels == {} and pub.annotations == H100_ANNOTATIONS


def test_no_gpus_seen_by_nvml() -> None:
    pub = gl.desired(NodeGPUReport(driver="550.54.15", cuda="12.4"), {}, {})
    assert pub.labels == {}
    assert pub.annotations[GPU_HEALTH_REASON_ANNOTATION] == "NVML reports no GPUs on this node"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
        ("Tesla  V100 (PCIe) 16GB", "Tesla-V100-PCIe-16GB"),
        ("NVIDIA " + "X" * 80, "NVIDIA-" + "X" * 56),
        (" -weird name- ", "weird-name"),
    ],
)
def test_product_values_are_gfd_sanitised_label_values(name: str, value: str) -> None:
    assert gl.product_label_value(name) == value


def test_driver_without_revision() -> None:
    labels = gl.nvml_labels(NodeGPUReport(driver="550.54", devices=(GPUInfo(0, "NVIDIA L4", "GPU-0", 23034),)))
    assert labels["nvidia.com/cuda.driver-version.revision"] == ""
    assert labels["nvidia.com/cuda.driver-version.full"] == "550.54"
    assert not any(k.startswith("nvidia.com/cuda.runtime-version") for k in labels)


def test_merge_patch_has_only_what_differs() -> None:
    pub = gl.Publication(labels={"a": "1", "b": "2"}, annotations={"x": "1", "gone": None, "absent": None})
    assert gl.merge_patch(pub, {"a": "1", "b": "2", "other": "z"}, {"x": "1"}) == {}
    assert gl.merge_patch(pub, {"a": "0"}, {"x": "1", "gone": "old"}) == {
        "metadata": {"labels": {"a": "1", "b": "2"}, "annotations": {"gone": None}}
    }


# ---------------------------------------------------------------------------------------- the agent


class StubReader:
    """A GPUReader whose next reading the test sets; counts the reads."""

    def __init__(self, report: NodeGPUReport) -> None:
        self.report = report
        self.reads = 0

    def read(self) -> NodeGPUReport:
        self.reads += 1
        return self.report


OTHER_LABELS = {"kubernetes.io/hostname": NODE, "nvidia.com/gpu.present": "true"}
OTHER_ANNOTATIONS = {"node.alpha.kubernetes.io/ttl": "0"}


def add_node(server: FakeApiServer, name: str = NODE, annotations: Mapping[str, str] | None = None) -> None:
    server.create(
        "nodes",
        {
            "metadata": {
                "name": name,
                "labels": dict(OTHER_LABELS),
                "annotations": {**OTHER_ANNOTATIONS, **(annotations or {})},
            },
            "status": {"capacity": {"nvidia.com/gpu": "8"}},
        },
    )


def node_meta(server: FakeApiServer, name: str = NODE) -> tuple[dict[str, str], dict[str, str]]:
    obj = server.get("nodes", "", name)
    assert obj is not None
    return dict(obj["metadata"].get("labels") or {}), dict(obj["metadata"].get("annotations") or {})


def settings(**kw: Any) -> GPUAgentSettings:
    return GPUAgentSettings(node=NODE, **kw)


def patches(server: FakeApiServer) -> list[Any]:
    return [r.body for r in server.calls("PATCH", NODE_PATH)]


async def test_the_agent_publishes_its_keys_and_leaves_the_rest() -> None:
    async with serve() as (server, api):
        add_node(server)
        add_node(server, "another-node")
        agent = GPUAgent(api, StubReader(read("h100x8")[0]), settings())
        await agent.sync()
        labels, annotations = node_meta(server)
        assert labels == {**OTHER_LABELS, **H100_LABELS}
        assert annotations == {**OTHER_ANNOTATIONS, **{k: v for k, v in H100_ANNOTATIONS.items() if v is not None}}
        assert [r.content_type for r in server.calls("PATCH", NODE_PATH)] == ["application/merge-patch+json"]
        assert agent.ready.is_set()
        assert node_meta(server, "another-node") == (OTHER_LABELS, OTHER_ANNOTATIONS)
        assert {(r.method, r.path) for r in server.requests} == {("GET", NODE_PATH), ("PATCH", NODE_PATH)}, (
            "only get and patch of its own node: what deploy/rbac/gpu-agent.yaml grants"
        )
        assert await agent.sync() == {}
        assert len(patches(server)) == 1, "an unchanged reading writes nothing"


async def test_a_changed_value_is_put_right_and_mig_going_off_removes_the_annotation() -> None:
    async with serve() as (server, api):
        add_node(server)
        mig = read("a100x4-mig")[0]
        reader = StubReader(mig)
        agent = GPUAgent(api, reader, settings())
        await agent.sync()
        assert gl.GPU_MIG_ANNOTATION in node_meta(server)[1]
        server.update("nodes", "", NODE, lambda n: n["metadata"]["labels"].update({"nvidia.com/gpu.count": "3"}))
        reader.report = dataclasses.replace(
            mig,
            devices=tuple(
                dataclasses.replace(d, mig_enabled=False, mig_pending=False, mig_devices=()) for d in mig.devices
            ),
        )
        assert await agent.sync() == {
            "metadata": {"labels": {"nvidia.com/gpu.count": "4"}, "annotations": {gl.GPU_MIG_ANNOTATION: None}}
        }
        labels, annotations = node_meta(server)
        assert gl.GPU_MIG_ANNOTATION not in annotations and labels["nvidia.com/gpu.count"] == "4"


async def test_without_nvml_the_nvidia_labels_stay_and_the_node_says_why() -> None:
    async with serve() as (server, api):
        add_node(server)
        server.update("nodes", "", NODE, lambda n: n["metadata"]["labels"].update(H100_LABELS))
        before_labels, _ = node_meta(server)
        nvml = read("no-library")[0]
        agent = GPUAgent(api, StubReader(nvml), settings())
        await agent.sync()
        labels, annotations = node_meta(server)
        assert labels == before_labels
        assert annotations[GPU_SOURCE_ANNOTATION] == "labels"
        assert annotations[gl.GPU_SOURCE_REASON_ANNOTATION] == nvml.nvml_error
        assert (annotations[GPU_HEALTH_ANNOTATION], annotations[GPU_HEALTH_REASON_ANNOTATION]) == (
            "Healthy",
            "NVML unavailable: health not checked",
        )


async def test_without_nvml_an_existing_health_verdict_is_kept() -> None:
    async with serve() as (server, api):
        verdict = {GPU_HEALTH_ANNOTATION: GPU_UNHEALTHY, GPU_HEALTH_REASON_ANNOTATION: "drained by an operator"}
        add_node(server, annotations=verdict)
        await GPUAgent(api, StubReader(read("no-library")[0]), settings()).sync()
        annotations = node_meta(server)[1]
        assert {k: annotations[k] for k in verdict} == verdict
        assert annotations[GPU_SOURCE_ANNOTATION] == "labels"


async def test_nvml_coming_back_removes_the_reason_it_was_missing() -> None:
    async with serve() as (server, api):
        add_node(server)
        reader = StubReader(read("no-library")[0])
        agent = GPUAgent(api, reader, settings())
        await agent.sync()
        reader.report = read("h100x8")[0]
        await agent.sync()
        annotations = node_meta(server)[1]
        assert gl.GPU_SOURCE_REASON_ANNOTATION not in annotations
        assert annotations[GPU_SOURCE_ANNOTATION] == "nvml" and annotations[GPU_HEALTH_REASON_ANNOTATION].startswith(
            "8 GPU"
        )


async def test_a_missing_node_is_a_clear_error() -> None:
    async with serve() as (server, api):
        add_node(server, "someone-else")
        agent = GPUAgent(api, StubReader(read("h100x8")[0]), settings(once=True))
        with pytest.raises(GPUAgentError, match=f"node '{NODE}' not found: --node must be"):
            await agent.run()
        assert patches(server) == []


async def test_the_loop_reads_every_interval_and_writes_once() -> None:
    async with serve() as (server, api):
        add_node(server)
        reader = StubReader(read("h100x8")[0])
        agent = GPUAgent(api, reader, settings(interval_s=0.01))
        async with running(agent.run()):
            await until(lambda: reader.reads >= 4, what="four readings")
        assert len(patches(server)) == 1


async def test_once_reads_once_and_returns() -> None:
    async with serve() as (server, api):
        add_node(server)
        reader = StubReader(read("ecc-error")[0])
        await asyncio.wait_for(GPUAgent(api, reader, settings(once=True, interval_s=3600)).run(), 2)
        assert reader.reads == 1 and node_meta(server)[1][GPU_HEALTH_ANNOTATION] == GPU_UNHEALTHY


# ---------------------------------------------------------------------------------------- CLI and RBAC

runner = CliRunner()


async def test_the_device_checks_cli_run_publishes_here_too() -> None:
    """tests/device/agent_on_nvml.py's `gpufed gpu-agent --once` run, on this machine without NVIDIA's
    library: the same CLI, flags, kubeconfig and Node the GPU machine's check uses, so that check
    cannot rot between the sessions that have a GPU."""
    report = NvmlReader().read()
    labels, annotations, log = await device_check.publish()
    assert labels["kubernetes.io/hostname"] == device_check.NODE, "a label the agent does not own is kept"
    if report.nvml_error is not None:
        assert labels == {"kubernetes.io/hostname": device_check.NODE}, "labels are left to the device plugin"
        assert annotations[GPU_SOURCE_ANNOTATION] == "labels", log
        assert "NVMLError" in annotations["gpufed.io/gpu-source-reason"], log
    else:  # a machine with a driver: what NVML read
        assert annotations[GPU_SOURCE_ANNOTATION] == "nvml", log
        assert labels[gl.GPU_COUNT_LABEL] == str(len(report.devices)), log
    assert annotations[GPU_HEALTH_ANNOTATION] == GPU_HEALTHY, log
    assert "published gpu facts" in log


def test_cli_flag_errors(tmp_path: Path) -> None:
    from gpufed.cli import app  # here, not at the top: the other tests need no CLI

    kc = str(tmp_path / "kubeconfig")
    res = runner.invoke(app, ["gpu-agent", "--kubeconfig", kc])
    assert res.exit_code == 2 and "--node" in res.output
    res = runner.invoke(app, ["gpu-agent", "--node", "GPU_Node", "--kubeconfig", kc])
    assert res.exit_code == 2 and "--node must be a Kubernetes node name" in " ".join(res.output.split())
    res = runner.invoke(app, ["gpu-agent", "--node", NODE, "--kubeconfig", kc, "--interval-s", "0"])
    assert res.exit_code == 2 and "--interval-s must be at least 1 second" in " ".join(res.output.split())
    res = runner.invoke(app, ["gpu-agent", "--node", NODE, "--kubeconfig", kc, "--once"])
    assert res.exit_code == 1 and "cannot load kubeconfig" in " ".join(res.output.split())
    res = runner.invoke(app, ["gpu-agent", "--help"])
    assert res.exit_code == 0 and "--interval-s" in res.output and "--once" in res.output


def test_rbac_grants_get_and_patch_of_nodes_only() -> None:
    docs = manifests.load([REPO / "deploy" / "rbac" / "gpu-agent.yaml"])
    by_kind = {d["kind"]: d for d in docs}
    assert sorted(by_kind) == ["ClusterRole", "ClusterRoleBinding", "ServiceAccount"]
    for d in docs:
        manifests.object_path(d)  # the installer knows how to apply each
    assert by_kind["ClusterRole"]["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    binding = by_kind["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == by_kind["ClusterRole"]["metadata"]["name"] == "gpufed-gpu-agent"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpufed-gpu-agent", "namespace": "gpufed"},
        {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "gpufed:gpu-agent"},
    ]


if __name__ == "__main__":  # record this machine's NVML session: python -m tests.unit.gpupool.agent.test_agent OUT.json
    recorder = RecordingPynvml(pynvml)
    print(NvmlReader(recorder).read())
    Path(sys.argv[1]).write_text(json.dumps({"description": "recorded", "calls": recorder.calls}, indent=1) + "\n")
