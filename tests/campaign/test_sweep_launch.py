"""A sweep's launch refused by its preflight (``campaign/sweep/launch.py`` ``launch_and_run``): the
launch is recorded as refused, with the rule that failed and whether it was for lack of memory, and
nothing is spawned. Here the port rule fails (the job's port is taken by a listener this test holds)
on a real llama-server job, through the local placement as `harvest compare` and `tune` launch."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from harvest.campaign.sweep.launch import launch_and_run
from harvest.config import PreflightConfig, ServerConfig
from harvest.placement import from_config


def test_a_launch_refused_by_its_preflight_is_recorded_not_raised_and_spawns_nothing(tmp_path, llama_server_bin,
                                                                                   tiny_gguf):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        cfg = ServerConfig(engine="llamacpp", model=str(tiny_gguf), command=[llama_server_bin], port=port,
                           extra_args=["-c", "2048"], ready_timeout=60, stop_grace=2, stop_deadline=15)
        worked: list[bool] = []

        async def work(fleet: object) -> bool:
            worked.append(True)
            return True

        result, launch = asyncio.run(launch_and_run(
            "candidate-1", cfg, tmp_path, work, server_factory=from_config(None).fleet(probe=True),
            preflight=PreflightConfig(min_disk_free_gib=0.05, ram_reserve_gib=0)))

    assert result is None and worked == []
    assert launch.reason == "preflight" and not launch.memory_bound, launch
    assert launch.error is not None and f"port {port}" in launch.error, launch.error
    assert launch.stop is None and launch.stopped_clean  # nothing was launched, nothing to stop
    assert not (Path(tmp_path) / "server" / "server.log").exists()  # the engine never ran
    assert launch.to_dict()["reason"] == "preflight"
