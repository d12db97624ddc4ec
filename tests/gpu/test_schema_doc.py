"""The documented schemas exist and the validator used against them rejects what it should."""

from __future__ import annotations

from tests.gpu.schema_doc import documented_schema, problems


def test_both_schemas_are_documented():
    assert documented_schema("harvest.gpus/1")["properties"]["schema"] == {"const": "harvest.gpus/1"}
    assert documented_schema("harvest.preflight/1")["properties"]["schema"] == {"const": "harvest.preflight/1"}


def test_validator_catches_missing_extra_and_mistyped_keys():
    schema = documented_schema("harvest.gpus/1")
    good = {"schema": "harvest.gpus/1", "time": "t", "source": "none", "driver_version": None,
            "unavailable_reason": "no NVIDIA driver found", "warnings": [], "gpus": [],
            "host": {"ram_total_mib": 1, "ram_available_mib": 1, "swap_total_mib": 0, "swap_used_mib": 0}}
    assert problems(good, schema) == []
    bad = dict(good, source="cuda", extra=1, host={"ram_total_mib": 1.5})
    del bad["warnings"]
    found = "\n".join(problems(bad, schema))
    for text in ("'cuda' not in", "undocumented key 'extra'", "missing 'warnings'", "$.host.ram_total_mib: float",
                 "$.host: missing 'swap_used_mib'"):
        assert text in found
    assert problems(dict(good, gpus=[{"index": True}]), schema)  # a bool is not an integer
