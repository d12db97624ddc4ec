"""The soak's short version (``bench/soak.py``, about 3 minutes): a managed llama-server campaign
left alone while every kind of fault is injected once, at random shares of the items committed.

SIGKILL of the engine's group, SIGSTOP of it (10 s here, 60 s in the full soak) then SIGCONT, a hang
(completions held while /health answers; ``hang_floor`` 5 s and ``hang_deadline`` 15 s here, at the
tiny model's scale), ``harvest run`` SIGKILLed and started again, and an engine ignoring SIGTERM met
by the resumed session's verified stop. The run must end by itself with every id exactly once
(ledger and export), no engine process left, every stop clean. The full soak and its table:
RELIABILITY.md.
"""

from __future__ import annotations

import json

import pytest

from bench import soak

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_short_soak_survives_every_fault_kind_with_nothing_lost_or_duplicated(tmp_path, llama_server_bin,
                                                                            tiny_gguf, monkeypatch):
    monkeypatch.setenv("HARVEST_LLAMA_SERVER", llama_server_bin)
    code = soak.main(["--items", "3000", "--stop-seconds", "10", "--hang-deadline", "15", "--hang-floor", "5",
                      "--faults", ",".join(soak.KINDS), "--dir", str(tmp_path), "--end-timeout", "600",
                      "--gguf", str(tiny_gguf)])
    summary = json.loads((tmp_path / "soak.json").read_text())
    assert code == 0, summary["problems"]
    assert summary["problems"] == [] and summary["lost"] == 0 and summary["duplicated"] == 0, summary
    assert sorted(f["kind"] for f in summary["faults"]) == sorted(soak.KINDS), summary["faults"]
    assert all(f.get("recovered_s") is not None for f in summary["faults"]), summary["faults"]
    assert summary["stops_escalated"] >= 1, summary  # the engine that ignored SIGTERM was SIGKILLed
