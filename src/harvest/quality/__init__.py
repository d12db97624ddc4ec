"""quality: is a candidate server's output as good as the reference's, and how fast is it?

    prompts = select_prompts(job.data, n=32, seed=0)                  # probe.py: the probe set
    async with open_wire(server_config) as wire:                        # wire.py: per-engine requests
        reference = await generate_reference(wire, prompts, probe, settings_hash=h)   # reference.py
        outputs = await run_candidate(wire, reference, probe)
    report = quality_report(reference, outputs)                         # evaluate.py: metrics + CIs
    result = gate(report, floor_report, GateSettings())                 # relative to the noise floor

Also: the policy rules and memory order that decide what is launched (policy.py), the optional
task check (task.py), the throughput probe (throughput.py) and the settings tables (settings.py).
This package measures and judges; it never launches or stops a server (``campaign.compare`` and
``campaign.tune`` do, through the supervisor).
"""

from __future__ import annotations

from harvest.quality.evaluate import (
    Check,
    GateResult,
    QualityReport,
    TaskReport,
    gate,
    quality_report,
    task_records,
)
from harvest.quality.metrics import (
    Estimate,
    GreedyReport,
    PositionScores,
    TeacherForcedReport,
    approx_kl,
    bootstrap,
)
from harvest.quality.policy import needs_at_least, setting_items, violations
from harvest.quality.probe import ProbePrompt, select_prompts
from harvest.quality.reference import (
    ProbeOutput,
    Reference,
    ReferenceEntry,
    generate_reference,
    load_reference,
    reference_hash,
    run_candidate,
    save_reference,
)
from harvest.quality.settings import (
    GateSettings,
    PolicySettings,
    ProbeSettings,
    QualitySettings,
    TaskSettings,
)
from harvest.quality.task import run_task
from harvest.quality.throughput import ThroughputResult, ThroughputSettings, throughput_probe
from harvest.quality.wire import Generation, TokenScore, Wire, open_wire, protocol_for

__all__ = [
    "Check",
    "Estimate",
    "GateResult",
    "GateSettings",
    "Generation",
    "GreedyReport",
    "PolicySettings",
    "PositionScores",
    "ProbeOutput",
    "ProbePrompt",
    "ProbeSettings",
    "QualityReport",
    "QualitySettings",
    "Reference",
    "ReferenceEntry",
    "TaskReport",
    "TaskSettings",
    "TeacherForcedReport",
    "ThroughputResult",
    "ThroughputSettings",
    "TokenScore",
    "Wire",
    "approx_kl",
    "bootstrap",
    "gate",
    "generate_reference",
    "load_reference",
    "needs_at_least",
    "open_wire",
    "protocol_for",
    "quality_report",
    "reference_hash",
    "run_candidate",
    "run_task",
    "save_reference",
    "select_prompts",
    "setting_items",
    "task_records",
    "throughput_probe",
    "violations",
]
