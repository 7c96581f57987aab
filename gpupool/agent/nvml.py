"""Reading this node's GPUs through NVML (pynvml): model, memory, MIG layout, driver and memory health.

Owns: the `GPUReader` Protocol the agent reads through, `NvmlReader` (the NVML implementation), and
the plain values a reading is made of (`NodeGPUReport`, `GPUInfo`). One `read()` is one NVML
session: nvmlInit, the queries below, nvmlShutdown.

Queries: driver version and the CUDA version the driver supports; per device (by index) its name,
UUID and total memory, MIG mode (current and pending) and, when MIG is on, the MIG devices present
counted by profile; the volatile uncorrectable ECC count (errors since the driver loaded), whether
page retirement is pending (pre-Ampere) and whether row remapping is pending or has failed (Ampere
and later).

Invariants:
- `read()` does not raise for NVML's sake: when NVML cannot start (libnvidia-ml not found, driver
  not loaded, ... — the case on machines without NVIDIA GPUs) or a node-wide query fails, the
  report has no devices and `nvml_error` says why.
- A query NVML answers with NotSupported, NoPermission or FunctionNotFound (an older driver) is
  *unknown* (None): a GPU is never unhealthy for what NVML cannot tell.
- Any other NVML failure on one device (GPU lost, reset required, ...) is kept in that device's
  `error` with what was read before it; the other devices are still read.
- MIG profile names are NVIDIA's (`nvidia-smi mig`, the device plugin's `nvidia.com/mig-<profile>`
  resources): `<g>g.<gb>gb`, or `<c>c.<g>g.<gb>gb` for a compute instance smaller than its GPU
  instance, with the memory rounded as go-nvlib rounds it (`mig_profile_name`).

Does not: judge health or choose labels (`gpupool.agent.labels`), talk to the API server
(`gpupool.agent.agent`), watch XID events (that needs a blocking event-set wait loop of its
own), or tell media-extension (`+me`) profiles apart. NVML calls block: call `read` in a thread.
pynvml is imported on first use, so importing this module needs no NVIDIA library.
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

#: NVML errors that mean "NVML cannot tell", not "the GPU is broken".
UNKNOWN_ERRORS = ("NVMLError_NotSupported", "NVMLError_NoPermission", "NVMLError_FunctionNotFound")
#: What to check when NVML cannot start, by error.
_HINTS = {
    "NVMLError_LibraryNotFound": "no NVIDIA driver on this node, or libnvidia-ml.so.1 not mounted into the container",
    "NVMLError_DriverNotLoaded": "the NVIDIA kernel driver is not loaded",
    "NVMLError_LibRmVersionMismatch": "libnvidia-ml and the loaded kernel driver differ in version",
    "NVMLError_NoPermission": "no permission to open the NVIDIA devices",
}
_MIB = 1024 * 1024
_GIB = 1024 * _MIB


@dataclass(frozen=True)
class GPUInfo:
    """One physical GPU as NVML reported it; None means NVML could not tell."""

    #: NVML's index of the device on this node.
    index: int
    #: NVML's product name, e.g. "NVIDIA H100 80GB HBM3"; "" when it could not be read.
    name: str = ""
    #: e.g. "GPU-5d5b3d6c-...". Not a secret; "" when it could not be read.
    uuid: str = ""
    #: Total framebuffer memory in MiB.
    memory_mib: int | None = None
    #: MIG mode now (True: on); None: the GPU is not MIG-capable.
    mig_enabled: bool | None = None
    #: MIG mode after the next GPU reset.
    mig_pending: bool | None = None
    #: MIG devices present by profile, sorted by profile, e.g. (("1g.5gb", 3), ("3g.20gb", 1)); empty
    #: when MIG is off; None when MIG is on and the devices could not be read.
    mig_devices: tuple[tuple[str, int], ...] | None = ()
    #: Uncorrectable ECC errors since the driver loaded (volatile counter).
    ecc_uncorrected: int | None = None
    #: Pages waiting for retirement at the next reset (pre-Ampere memory repair).
    retired_pages_pending: bool | None = None
    #: Rows waiting for remapping at the next reset (Ampere and later memory repair).
    remap_pending: bool | None = None
    #: A row remapping failed: the memory cannot be repaired.
    remap_failed: bool | None = None
    #: NVML failed on this device (e.g. "GPU is lost"); the fields after the failure are unknown.
    error: str | None = None

    @property
    def mig_capable(self) -> bool:
        return self.mig_enabled is not None


@dataclass(frozen=True)
class NodeGPUReport:
    """What one reading of NVML found on this node."""

    #: NVIDIA driver version, e.g. "550.54.15".
    driver: str | None = None
    #: Highest CUDA version the driver supports, e.g. "12.4".
    cuda: str | None = None
    devices: tuple[GPUInfo, ...] = ()
    #: Why NVML could not be read (then `devices` is empty); None when it was.
    nvml_error: str | None = None


class GPUReader(Protocol):
    """Reads this node's GPUs; blocking (the agent calls it in a thread); raises only for bugs."""

    def read(self) -> NodeGPUReport: ...


def cuda_version(value: int) -> str:
    """NVML's CUDA driver version number as "major.minor" (12040 -> "12.4"), as nvml.h's macros split it."""
    return f"{value // 1000}.{value % 1000 // 10}"


def mig_profile_name(gi_slices: int, ci_slices: int, memory_mb: int, device_memory_bytes: int) -> str:
    """A MIG device's profile name from its attributes and its parent's total memory (go-nvlib's rule:
    the memory share rounded up to eighths of the GPU, times the GPU's memory in whole GiB)."""
    if device_memory_bytes > 0:
        share = math.ceil(memory_mb * _MIB / device_memory_bytes * 8) / 8
        gb = math.floor(share * ((device_memory_bytes + _GIB - 1) // _GIB) + 0.5)  # Go's math.Round
    else:  # the parent's memory unknown: the device's own, in GiB
        gb = math.floor(memory_mb / 1024 + 0.5)
    if ci_slices == gi_slices:
        return f"{gi_slices}g.{gb}gb"
    return f"{ci_slices}c.{gi_slices}g.{gb}gb"


def _text(value: Any) -> str:
    """pynvml answers str (older versions bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def describe(error: BaseException) -> str:
    """An NVML error as a person reads it, e.g. "GPU is lost [NVMLError_GpuIsLost]", with a hint where one helps."""
    name = type(error).__name__
    text = f"{error} [{name}]"
    hint = _HINTS.get(name)
    return f"{text}: {hint}" if hint else text


class NvmlReader:
    """`GPUReader` through pynvml. `nvml` is the pynvml module (tests pass a recorded fake); None
    imports the real one on the first `read`."""

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = nvml

    def _module(self) -> Any:
        if self._nvml is None:
            import pynvml  # lazily: importing it loads nothing, but keep NVML out of import time

            self._nvml = pynvml
        return self._nvml

    def read(self) -> NodeGPUReport:
        try:
            nv = self._module()
        except ImportError as e:
            return NodeGPUReport(nvml_error=f"pynvml cannot be imported: {e}")
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            return NodeGPUReport(nvml_error=f"NVML cannot start: {describe(e)}")
        try:
            driver = self._maybe(nv, nv.nvmlSystemGetDriverVersion)
            cuda = self._maybe(nv, nv.nvmlSystemGetCudaDriverVersion)
            count = int(nv.nvmlDeviceGetCount())
            return NodeGPUReport(
                driver=None if driver is None else _text(driver),
                cuda=None if cuda is None else cuda_version(int(cuda)),
                devices=tuple(self._device(nv, i) for i in range(count)),
            )
        except nv.NVMLError as e:
            return NodeGPUReport(nvml_error=f"NVML failed: {describe(e)}")
        finally:
            with contextlib.suppress(nv.NVMLError):  # nothing to undo: the next read initialises again
                nv.nvmlShutdown()

    @staticmethod
    def _maybe(nv: Any, fn: Callable[..., T], *args: Any) -> T | None:
        """`fn(*args)`, or None when NVML cannot tell; other NVML errors propagate."""
        try:
            return fn(*args)
        except nv.NVMLError as e:
            if type(e).__name__ in UNKNOWN_ERRORS:
                return None
            raise

    def _device(self, nv: Any, index: int) -> GPUInfo:
        facts: dict[str, Any] = {}
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            facts["name"] = _text(nv.nvmlDeviceGetName(handle))
            facts["uuid"] = _text(nv.nvmlDeviceGetUUID(handle))
            total = int(nv.nvmlDeviceGetMemoryInfo(handle).total)
            facts["memory_mib"] = total // _MIB
            mig = self._maybe(nv, nv.nvmlDeviceGetMigMode, handle)
            if mig is not None:
                facts["mig_enabled"] = int(mig[0]) == nv.NVML_DEVICE_MIG_ENABLE
                facts["mig_pending"] = int(mig[1]) == nv.NVML_DEVICE_MIG_ENABLE
                if facts["mig_enabled"]:
                    facts["mig_devices"] = self._mig_devices(nv, handle, total)
            ecc = self._maybe(
                nv,
                nv.nvmlDeviceGetTotalEccErrors,
                handle,
                nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nv.NVML_VOLATILE_ECC,
            )
            facts["ecc_uncorrected"] = None if ecc is None else int(ecc)
            retired = self._maybe(nv, nv.nvmlDeviceGetRetiredPagesPendingStatus, handle)
            facts["retired_pages_pending"] = None if retired is None else bool(retired)
            rows = self._maybe(nv, nv.nvmlDeviceGetRemappedRows, handle)
            if rows is not None:
                _corrected, _uncorrected, pending, failed = rows
                facts["remap_pending"], facts["remap_failed"] = bool(pending), bool(failed)
        except nv.NVMLError as e:
            if facts.get("mig_enabled") and "mig_devices" not in facts:
                facts["mig_devices"] = None
            return GPUInfo(index=index, error=describe(e), **facts)
        return GPUInfo(index=index, **facts)

    def _mig_devices(self, nv: Any, handle: Any, total_bytes: int) -> tuple[tuple[str, int], ...] | None:
        slots = self._maybe(nv, nv.nvmlDeviceGetMaxMigDeviceCount, handle)
        if slots is None:
            return None
        found: Counter[str] = Counter()
        for slot in range(int(slots)):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nv.NVMLError_NotFound:
                continue  # an empty slot
            attrs = self._maybe(nv, nv.nvmlDeviceGetAttributes, mig)
            if attrs is None:
                return None
            found[
                mig_profile_name(
                    int(attrs.gpuInstanceSliceCount),
                    int(attrs.computeInstanceSliceCount),
                    int(attrs.memorySizeMB),
                    total_bytes,
                )
            ] += 1
        return tuple(sorted(found.items()))


__all__ = [
    "UNKNOWN_ERRORS",
    "GPUInfo",
    "GPUReader",
    "NodeGPUReport",
    "NvmlReader",
    "cuda_version",
    "describe",
    "mig_profile_name",
]
