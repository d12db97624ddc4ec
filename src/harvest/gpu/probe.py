"""Choosing a GPU probe: NVML first, nvidia-smi when NVML cannot load, a no-GPU probe otherwise.

``open_probe`` never raises for "this machine has no NVIDIA driver": it returns a probe whose
snapshot says so (``unavailable_reason``), so commands print a clear line instead of a traceback.
It never hides a driver that is present but failing: that is recorded in the snapshot warnings.
"""

from __future__ import annotations

from harvest.errors import NoDriverError, ProbeError
from harvest.gpu.records import GpuProbe, GpuSnapshot, ProbeSource

NO_DRIVER = "no NVIDIA driver found"


class NoGpuProbe:
    """The probe of a machine without a usable NVIDIA driver: no GPUs, and a reason."""

    source: ProbeSource = "none"

    def __init__(self, reason: str = NO_DRIVER, warnings: tuple[str, ...] = ()):
        self.reason = reason
        self.warnings = warnings

    def snapshot(self) -> GpuSnapshot:
        return GpuSnapshot(source="none", gpus=(), unavailable_reason=self.reason, warnings=self.warnings)

    def memory_used(self, indices: list[int]) -> dict[int, int]:
        """Empty for no indices; any index raises NoDriverError (there is nothing to measure)."""
        if indices:
            raise NoDriverError(f"GPU {indices[0]} requested but {self.reason}", gpu=indices[0])
        return {}

    def close(self) -> None:
        """Nothing to release."""


def open_probe(*, prefer: str = "auto") -> GpuProbe:
    """The best available probe.

    ``prefer``: ``"auto"`` (NVML, then nvidia-smi, then none), ``"nvml"``, ``"smi"`` (only that
    one, else the no-GPU probe) or ``"none"``. A probe that fails to start is recorded in the
    no-GPU probe's warnings.
    """
    from harvest.gpu.nvml import NvmlProbe  # noqa: PLC0415 - keep `harvest.gpu` import cheap
    from harvest.gpu.smi import SmiProbe  # noqa: PLC0415

    if prefer not in ("auto", "nvml", "smi", "none"):
        raise ValueError(f"prefer must be 'auto', 'nvml', 'smi' or 'none', not {prefer!r}")
    notes: list[str] = []
    broken: list[str] = []  # a driver that is there but fails is not "no driver"
    if prefer in ("auto", "nvml"):
        try:
            return NvmlProbe()
        except ProbeError as exc:
            notes.append(f"NVML: {exc}")
            if not isinstance(exc, NoDriverError):
                broken.append(notes[-1])
    if prefer in ("auto", "smi"):
        try:
            return SmiProbe()
        except ProbeError as exc:
            notes.append(f"nvidia-smi: {exc}")
            if not isinstance(exc, NoDriverError):
                broken.append(notes[-1])
    if prefer == "none":
        return NoGpuProbe("GPU probing turned off", ())
    reason = f"NVIDIA driver present but not usable ({broken[0]})" if broken else NO_DRIVER
    return NoGpuProbe(reason, tuple(notes))


__all__ = ["NO_DRIVER", "NoGpuProbe", "open_probe"]
