"""`actorgraph devices`: what this machine offers, without opening (or requiring) any of it."""

from __future__ import annotations

import importlib
import os
from typing import Any

import attrs

from actorgraph import devices as _devices
from actorgraph.devices import install_hint

# How a device of a worker is named (see `actorgraph worker`).
REMOTE_NAMES = "KIND:N@HOST:PORT"


@attrs.frozen
class GPUInfo:
    """One GPU as the CUDA driver describes it."""

    index: int
    name: str
    memory_bytes: int
    compute_capability: tuple[int, int]


@attrs.frozen
class Inventory:
    """What this machine offers (device kinds, CPU cores, CUDA GPUs, SIM presets), as
    `local_devices()` finds it.

    Attributes:
        kinds: the device kinds this machine can open ("CPU", "SIM", "CUDA").
        cpu_cores: the CPU cores the process may use.
        gpus: each CUDA GPU the driver sees: its index, name, memory and compute capability.
        gpu_note: why no GPU is listed, or the driver's version.
        sim_presets: the names of the SIM cost-model presets.
        sim_default: the preset SIM devices use unless told otherwise.
        nvrtc_note: which NVRTC compiles CUDA kernels here, or why none does.
        fake_only: kinds that open here only through the fake CUDA driver (no GPU).
        sim_machines: per SIM preset, the machine it simulates (shape, links, device names).
    """

    kinds: tuple[str, ...]  # device kinds this machine can open ("CPU", "SIM", ...)
    cpu_cores: int
    gpus: tuple[GPUInfo, ...]
    gpu_note: str  # why no GPU is listed, or the driver version
    sim_presets: tuple[str, ...]
    sim_default: str | None
    nvrtc_note: str = ""  # which NVRTC compiles CUDA kernels here, or why none does
    # Kinds this install has that open here only through the fake CUDA driver (no GPU).
    fake_only: tuple[str, ...] = ()
    # (preset, the machine it simulates: shape, links, device names), per SIM preset
    sim_machines: tuple[tuple[str, str], ...] = ()

    def as_json(self) -> dict[str, Any]:
        """The inventory as plain data, as `actorgraph devices --json` prints it.

        Returns:
            A dict of lists, strings and numbers that json.dumps writes.
        """
        return {
            "kinds": list(self.kinds),
            "fake_driver_only": list(self.fake_only),
            "cpu_cores": self.cpu_cores,
            "cuda_gpus": [
                {
                    "name": f"CUDA:{g.index}",
                    "model": g.name,
                    "memory_bytes": g.memory_bytes,
                    "compute_capability": list(g.compute_capability),
                }
                for g in self.gpus
            ],
            "cuda_note": self.gpu_note,
            "nvrtc_note": self.nvrtc_note,
            "sim_presets": list(self.sim_presets),
            "sim_default": self.sim_default,
            "sim_machines": dict(self.sim_machines),
            "remote_names": REMOTE_NAMES,
        }


def probe_cuda() -> tuple[tuple[GPUInfo, ...], str]:
    """GPUs the CUDA driver sees. Never raises: no cuda-python, no driver, no GPU -> a note."""
    try:
        from cuda.bindings import driver  # type: ignore[import-untyped]
    except Exception as error:  # noqa: BLE001 - any import failure means "no CUDA here"
        return (), f"cuda-python is not importable ({type(error).__name__})"
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return (), f"the CUDA driver did not initialise ({err.name})"
        err, version = driver.cuDriverGetVersion()
        err, count = driver.cuDeviceGetCount()
        gpus = []
        for index in range(count):
            err, dev = driver.cuDeviceGet(index)
            err, raw = driver.cuDeviceGetName(256, dev)
            err, memory = driver.cuDeviceTotalMem(dev)
            attr = driver.CUdevice_attribute
            err, major = driver.cuDeviceGetAttribute(
                attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev
            )
            err, minor = driver.cuDeviceGetAttribute(
                attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev
            )
            name = raw.split(b"\0", 1)[0].decode(errors="replace")
            gpus.append(GPUInfo(index, name, int(memory), (int(major), int(minor))))
        note = f"driver {version // 1000}.{version % 1000 // 10}"
        return tuple(gpus), note if gpus else f"{note}, but it sees no GPU"
    except Exception as error:  # noqa: BLE001 - e.g. the driver library is missing
        text = str(error)
        if "driver library" in text or "libcuda" in text:
            return (), "no NVIDIA driver on this machine (libcuda not found)"
        first = text.strip().split(". ")[0][:120]
        return (), f"the CUDA driver could not be queried ({type(error).__name__}: {first})"


def probe_nvrtc() -> str:
    """Which NVRTC would compile `Kernel(cuda=...)` sources here. Never raises."""
    try:
        from cuda.bindings import nvrtc

        _, major, minor = nvrtc.nvrtcVersion()
        _, archs = nvrtc.nvrtcGetSupportedArchs()
    except Exception:  # noqa: BLE001 - no cuda-python or no NVRTC library
        return f"not installed: to compile CUDA kernels, {install_hint('cuda')}"
    archs = sorted(int(a) for a in archs)
    return f"{major}.{minor}, builds sm_{archs[0]} to sm_{archs[-1]}"


def local_devices() -> Inventory:
    """What this machine offers, as `actorgraph devices` prints it: device kinds, CUDA GPUs,
    SIM presets.

    It opens nothing; without cuda-python, a driver or a GPU, `gpus` is empty and
    `gpu_note` says why.

    Returns:
        The Inventory.
    """
    gpus, note = probe_cuda()
    # SIM's cost-model presets, where this install has SIM devices.
    presets = getattr(_devices, "PRESETS", None)
    default = None
    if presets is not None:
        try:
            costmodel = importlib.import_module("actorgraph.devices._costmodel")
            default = getattr(costmodel, "DEFAULT_PRESET", None)
        except ImportError:
            default = None
    # CUDA:N opens on a GPU; without one, only through the fake driver.
    fake_only = () if gpus or "CUDA" not in _devices.DEVICE_KINDS else ("CUDA",)
    machines = tuple(
        (name, model.describe())
        for name, model in sorted((presets or {}).items())
        if callable(getattr(model, "describe", None))
    )
    return Inventory(
        kinds=tuple(k for k in _devices.DEVICE_KINDS if k not in fake_only),
        fake_only=fake_only,
        cpu_cores=os.cpu_count() or 1,
        gpus=gpus,
        gpu_note=note,
        sim_presets=tuple(sorted(presets)) if presets else (),
        sim_default=default,
        nvrtc_note=probe_nvrtc(),
        sim_machines=machines,
    )


def render(inv: Inventory) -> str:
    lines = [f"device kinds this machine can open: {', '.join(inv.kinds)}"]
    if inv.fake_only:
        lines.append(
            f"         ({', '.join(inv.fake_only)} only through the fake driver, which runs "
            f'without a GPU: open_runtime(..., cuda_driver="fake") or '
            f"ACTORGRAPH_CUDA_DRIVER=fake)"
        )
    lines.append("")
    lines.append(
        f"CPU:N    host memory, a compute and a copy actor each; any N "
        f"(this machine has {inv.cpu_cores} cores, so up to {inv.cpu_cores} run in parallel)"
    )
    if inv.gpus:
        for gpu in inv.gpus:
            cc = ".".join(map(str, gpu.compute_capability))
            usable = "" if "CUDA" in inv.kinds else "  (no CUDA device kind in this install)"
            lines.append(
                f"CUDA:{gpu.index:<3} {gpu.name}, {gpu.memory_bytes / 2**30:.0f} GiB, "
                f"compute capability {cc}{usable}"
            )
        lines.append(f"         ({inv.gpu_note})")
    else:
        lines.append(f"CUDA     none: {inv.gpu_note}")
    if inv.nvrtc_note:
        lines.append(f"NVRTC    {inv.nvrtc_note}")
    if "SIM" in inv.kinds:
        if inv.sim_presets:
            names = ", ".join(
                f"{p} (default)" if p == inv.sim_default else p for p in inv.sim_presets
            )
            lines.append(f"SIM:N    simulated GPUs; cost-model presets (sim_preset=...): {names}")
            width = max((len(p) for p, _ in inv.sim_machines), default=0)
            for preset, machine in inv.sim_machines:
                lines.append(f"           {preset.ljust(width)}  {machine}")
        else:
            lines.append("SIM:N    simulated GPUs, any N")
    for kind in inv.kinds:
        if kind not in ("CPU", "SIM", "CUDA", "REMOTE"):
            lines.append(f"{kind}:N")
    lines.append(
        f"remote   {REMOTE_NAMES}: device KIND:N of an `actorgraph worker` listening on "
        f"HOST:PORT, e.g. CPU:0@127.0.0.1:7000 (IPv6: CPU:0@[::1]:7000)"
    )
    return "\n".join(lines)
