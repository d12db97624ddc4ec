"""Choosing a probe, and the no-driver state (a line, not a traceback)."""

from __future__ import annotations

import pytest

from harvest.errors import NoDriverError
from harvest.gpu import NO_DRIVER, NoGpuProbe, open_probe


def _nvml_loads() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:  # any failure: NVML is not usable here
        return False


def test_no_gpu_probe_states_the_reason_and_refuses_gpu_queries():
    probe = NoGpuProbe()
    snap = probe.snapshot()
    assert (snap.source, snap.gpus, snap.unavailable_reason) == ("none", (), "no NVIDIA driver found")
    assert probe.memory_used([]) == {}
    with pytest.raises(NoDriverError) as info:
        probe.memory_used([0])
    assert info.value.gpu == 0 and "GPU 0 requested but no NVIDIA driver found" in str(info.value)
    probe.close()
    probe.close()


def test_open_probe_on_this_machine():
    probe = open_probe()
    try:
        snap = probe.snapshot()
        if _nvml_loads():
            assert probe.source == "nvml" and snap.unavailable_reason is None
        else:
            # No NVML here: the fallback was tried and the answer is a clear state.
            assert probe.source in ("nvidia-smi", "none")
            if probe.source == "none":
                assert snap.unavailable_reason == NO_DRIVER
                assert any(w.startswith("NVML:") for w in snap.warnings)
                assert any(w.startswith("nvidia-smi:") for w in snap.warnings)
    finally:
        probe.close()


def test_prefer_none_and_bad_values():
    probe = open_probe(prefer="none")
    assert probe.source == "none" and probe.snapshot().gpus == ()
    with pytest.raises(ValueError):
        open_probe(prefer="cuda")
