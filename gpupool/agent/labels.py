"""What the GPU node agent publishes on its node: a GPU reading -> labels, annotations, a merge patch.

Owns: the label and annotation names the agent writes and their values, the health verdict, and
the patch that brings a node's current metadata to them touching only the agent's own keys.

Labels (GPU Feature Discovery's names and formats, so selectors written for GFD work on nodes that
only run this agent; written only from an NVML reading with at least one GPU):
- `nvidia.com/gpu.product`: NVML's name sanitised as GFD does ("NVIDIA H100 80GB HBM3" ->
  "NVIDIA-H100-80GB-HBM3"); `nvidia.com/gpu.memory`: total memory in MiB ("81559");
  `nvidia.com/gpu.count`: physical GPUs ("8"); `nvidia.com/mig.capable`: "true" when any GPU is;
- `nvidia.com/cuda.driver-version.{full,major,minor,revision}`: the NVIDIA driver ("550.54.15",
  "550", "54", "15"); `nvidia.com/cuda.runtime-version.{full,major,minor}`: the highest CUDA version
  that driver supports ("12.4", "12", "4"). GFD's deprecated `cuda.driver.*`/`cuda.runtime.*`
  spellings are not written.
- Not written: `nvidia.com/mig.strategy` (a setting of the device plugin, which NVML cannot see —
  a guess would mislead), GFD's per-MIG-profile labels (see the MIG annotation), family/compute
  capability and sharing labels.
- Mixed GPU models on one node (rare): product and memory are those of the lowest-indexed GPU NVML
  could name, as GFD does; the node stays healthy and `gpufed.io/gpu-products` counts GPUs per
  product so the estimator can tell.
- Where GFD runs (the node has `nvidia.com/gfd.timestamp`), `nvidia.com/*` labels are GFD's: the
  agent writes only its annotations. Two writers of one label would fight over MIG nodes, where
  GFD's product depends on the device plugin's MIG strategy.

Annotations (gpufed's own):
- `gpufed.io/gpu-source` (GPU_SOURCE_ANNOTATION): "nvml", or "labels" when NVML is unavailable;
  then `gpufed.io/gpu-source-reason` says why (removed again once NVML answers).
- `gpufed.io/gpu-health` / `-health-reason`: "Healthy", or "Unhealthy" when any GPU has
  uncorrectable ECC errors since the driver loaded, a failed or pending row remapping, pending page
  retirement, or failed an NVML query (e.g. "GPU is lost"); the reason names each GPU (index and
  UUID) and the count. Checks NVML cannot do (NotSupported) are listed in the Healthy reason.
- `gpufed.io/gpu-mig`: JSON of the MIG devices per GPU index with MIG on, e.g.
  `{"0":{"1g.5gb":3,"3g.20gb":1},"1":{}}` (null: MIG on but its devices unreadable); removed when
  no GPU has MIG on.
- `gpufed.io/gpu-products`: JSON product -> GPU count, only on nodes with more than one product.

Without NVML the agent leaves every `nvidia.com/*` label alone (the device plugin's capacity and
whatever GFD or an operator wrote stay the node's description), removes its MIG and products
annotations (facts it can no longer vouch for) and, unless the node already carries a health
verdict (an operator's, or its own from an earlier NVML reading — losing NVML proves neither
recovery nor failure), marks it Healthy with "NVML unavailable: health not checked" so the
estimator keeps counting the node on its capacity.

Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufed.apis.pool import GPU_PRODUCT_LABEL
from gpufed.apis.wire import (
    GPU_HEALTH_ANNOTATION,
    GPU_HEALTH_REASON_ANNOTATION,
    GPU_HEALTHY,
    GPU_SOURCE_ANNOTATION,
    GPU_UNHEALTHY,
)
from gpupool.agent.nvml import GPUInfo, NodeGPUReport

GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
MIG_CAPABLE_LABEL = "nvidia.com/mig.capable"
DRIVER_VERSION_LABEL = "nvidia.com/cuda.driver-version"  # + .full, .major, .minor, .revision
CUDA_RUNTIME_LABEL = "nvidia.com/cuda.runtime-version"  # + .full, .major, .minor
#: GFD's own label: where it is present, GFD owns the node's nvidia.com/* labels.
GFD_TIMESTAMP_LABEL = "nvidia.com/gfd.timestamp"
GPU_SOURCE_REASON_ANNOTATION = "gpufed.io/gpu-source-reason"
GPU_MIG_ANNOTATION = "gpufed.io/gpu-mig"
GPU_PRODUCTS_ANNOTATION = "gpufed.io/gpu-products"
SOURCE_NVML = "nvml"
SOURCE_LABELS = "labels"
NVML_UNAVAILABLE_REASON = "NVML unavailable: health not checked"
#: Every annotation the agent writes or removes.
OWNED_ANNOTATIONS = (
    GPU_SOURCE_ANNOTATION,
    GPU_SOURCE_REASON_ANNOTATION,
    GPU_HEALTH_ANNOTATION,
    GPU_HEALTH_REASON_ANNOTATION,
    GPU_MIG_ANNOTATION,
    GPU_PRODUCTS_ANNOTATION,
)
_LABEL_VALUE_MAX = 63
_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?$")


@dataclass(frozen=True)
class Health:
    status: str  # GPU_HEALTHY or GPU_UNHEALTHY
    reason: str


@dataclass(frozen=True)
class Publication:
    """What the node should carry: labels to set, annotations to set (a value) or remove (None)."""

    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str | None] = field(default_factory=dict)


def product_label_value(name: str) -> str:
    """GFD's sanitising of an NVML name for `nvidia.com/gpu.product`, cut to a valid label value."""
    kept = re.sub(r"[^A-Za-z0-9\-_. ]", "", name)
    value = "-".join(kept.split())[:_LABEL_VALUE_MAX]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def _who(d: GPUInfo) -> str:
    return f"GPU {d.index} ({d.uuid})" if d.uuid else f"GPU {d.index}"


def judge(report: NodeGPUReport) -> Health:
    """The health verdict of an NVML reading (the report must have no `nvml_error`)."""
    problems: list[str] = []
    for d in report.devices:
        who = _who(d)
        if d.error:
            problems.append(f"{who}: NVML query failed: {d.error}")
        if d.ecc_uncorrected:
            problems.append(f"{who}: {d.ecc_uncorrected} uncorrectable ECC error(s) since the driver loaded")
        if d.remap_failed:
            problems.append(f"{who}: row remapping failed (memory cannot be repaired)")
        if d.remap_pending:
            problems.append(f"{who}: row remapping pending (reset the GPU)")
        if d.retired_pages_pending:
            problems.append(f"{who}: page retirement pending (reset the GPU)")
    if problems:
        return Health(GPU_UNHEALTHY, "; ".join(problems))
    if not report.devices:
        return Health(GPU_HEALTHY, "NVML reports no GPUs on this node")
    reason = (
        f"{len(report.devices)} GPU(s) checked by NVML: no uncorrectable ECC errors, "
        "no failed or pending memory repairs"
    )
    no_ecc = [str(d.index) for d in report.devices if d.ecc_uncorrected is None]
    no_repair = [str(d.index) for d in report.devices if d.remap_failed is None and d.retired_pages_pending is None]
    if no_ecc:
        reason += f"; ECC not reported by GPU {', '.join(no_ecc)}"
    if no_repair:
        reason += f"; memory repair state not reported by GPU {', '.join(no_repair)}"
    return Health(GPU_HEALTHY, reason)


def _version_labels(prefix: str, version: str, parts: tuple[str, ...]) -> dict[str, str]:
    m = _VERSION.match(version)
    if m is None:  # not X.Y[.Z]: no parts, and the full value only if it is a valid label value
        ok = len(version) <= _LABEL_VALUE_MAX and re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", version)
        return {f"{prefix}.full": version} if ok else {}
    out = {f"{prefix}.full": version}
    for name, value in zip(parts, m.groups(), strict=False):
        out[f"{prefix}.{name}"] = value or ""
    return out


def nvml_labels(report: NodeGPUReport) -> dict[str, str]:
    """GFD-named labels of an NVML reading with GPUs (empty without)."""
    named = [d for d in report.devices if d.name]
    if not named:
        return {}
    first = named[0]
    labels = {
        GPU_PRODUCT_LABEL: product_label_value(first.name),
        GPU_COUNT_LABEL: str(len(report.devices)),
        MIG_CAPABLE_LABEL: "true" if any(d.mig_capable for d in report.devices) else "false",
    }
    if first.memory_mib is not None:
        labels[GPU_MEMORY_LABEL] = str(first.memory_mib)
    if report.driver:
        labels.update(_version_labels(DRIVER_VERSION_LABEL, report.driver, ("major", "minor", "revision")))
    if report.cuda:
        labels.update(_version_labels(CUDA_RUNTIME_LABEL, report.cuda, ("major", "minor")))
    return labels


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def mig_annotation(report: NodeGPUReport) -> str | None:
    """JSON of the MIG devices per GPU with MIG on; None when no GPU has MIG on."""
    layout = {
        str(d.index): (None if d.mig_devices is None else dict(d.mig_devices)) for d in report.devices if d.mig_enabled
    }
    return _compact(layout) if layout else None


def products_annotation(report: NodeGPUReport) -> str | None:
    """JSON product -> count when the node has GPUs of more than one product; else None."""
    counts = Counter(product_label_value(d.name) for d in report.devices if d.name)
    return _compact(dict(counts)) if len(counts) > 1 else None


def desired(report: NodeGPUReport, labels: Mapping[str, str], annotations: Mapping[str, str]) -> Publication:
    """What the node should carry after this reading, given its current labels and annotations."""
    if report.nvml_error is not None:
        out: dict[str, str | None] = {
            GPU_SOURCE_ANNOTATION: SOURCE_LABELS,
            GPU_SOURCE_REASON_ANNOTATION: report.nvml_error,
            GPU_MIG_ANNOTATION: None,
            GPU_PRODUCTS_ANNOTATION: None,
        }
        if GPU_HEALTH_ANNOTATION not in annotations:
            out[GPU_HEALTH_ANNOTATION] = GPU_HEALTHY
            out[GPU_HEALTH_REASON_ANNOTATION] = NVML_UNAVAILABLE_REASON
        return Publication(labels={}, annotations=out)
    health = judge(report)
    return Publication(
        labels={} if GFD_TIMESTAMP_LABEL in labels else nvml_labels(report),
        annotations={
            GPU_SOURCE_ANNOTATION: SOURCE_NVML,
            GPU_SOURCE_REASON_ANNOTATION: None,
            GPU_HEALTH_ANNOTATION: health.status,
            GPU_HEALTH_REASON_ANNOTATION: health.reason,
            GPU_MIG_ANNOTATION: mig_annotation(report),
            GPU_PRODUCTS_ANNOTATION: products_annotation(report),
        },
    )


def merge_patch(pub: Publication, labels: Mapping[str, str], annotations: Mapping[str, str]) -> dict[str, Any]:
    """A JSON merge patch of the node's metadata with only the keys that differ ({} when none do):
    values to set, null for owned annotations to remove that are present."""
    meta: dict[str, Any] = {}
    lab = {k: v for k, v in pub.labels.items() if labels.get(k) != v}
    ann = {
        k: v
        for k, v in pub.annotations.items()
        if (v is None and k in annotations) or (v is not None and annotations.get(k) != v)
    }
    if lab:
        meta["labels"] = lab
    if ann:
        meta["annotations"] = ann
    return {"metadata": meta} if meta else {}


__all__ = [
    "CUDA_RUNTIME_LABEL",
    "DRIVER_VERSION_LABEL",
    "GFD_TIMESTAMP_LABEL",
    "GPU_COUNT_LABEL",
    "GPU_MEMORY_LABEL",
    "GPU_MIG_ANNOTATION",
    "GPU_PRODUCTS_ANNOTATION",
    "GPU_SOURCE_REASON_ANNOTATION",
    "MIG_CAPABLE_LABEL",
    "NVML_UNAVAILABLE_REASON",
    "OWNED_ANNOTATIONS",
    "SOURCE_LABELS",
    "SOURCE_NVML",
    "Health",
    "Publication",
    "desired",
    "judge",
    "merge_patch",
    "mig_annotation",
    "nvml_labels",
    "product_label_value",
    "products_annotation",
]
