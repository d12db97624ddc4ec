"""``harvest gpus --cluster`` and ``harvest preflight --cluster`` against a real local Ray cluster.

The cluster is a head and one worker node started here with ``ray start --block`` (each in its own
process group, a custom resource to tell them apart, dashboard off, a small object store, a temp
folder of their own so no other Ray instance on the machine sees them) and stopped here by the pid
and group recorded at launch. The nodes' workers import harvest from this checkout through
``PYTHONPATH`` in the nodes' environment. Token authentication is off for this test cluster
(``RAY_AUTH_MODE=disabled`` for the nodes and the CLI alike).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests import harvest_process
from tests.gpu.schema_doc import only_answer, place_answers
from tests.realparts import require

require("ray", "Ray is the cluster backend these tests drive (a local cluster)")

import harvest  # noqa: E402 - after the gate

SRC = str(Path(harvest.__file__).resolve().parents[1])
RAY = str(Path(sys.executable).with_name("ray"))
ENV = {**os.environ, "PYTHONPATH": SRC, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
       "COLUMNS": "250"}


@dataclass
class Node:
    proc: subprocess.Popen[bytes]
    create_time: float
    log: Path

    def stop(self) -> None:
        """SIGTERM the ``ray start --block`` we started (it stops its node), then SIGKILL what is
        left of its process group."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=45)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.proc.poll() is None:
            self.proc.wait(timeout=10)

    def members(self) -> list[psutil.Process]:
        return [p for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == self.proc.pid]


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _start(args: list[str], folder: Path, name: str, wait_for: str, timeout: float = 180.0) -> tuple[Node, str]:
    log = folder / f"{name}.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen([RAY, "start", "--block", "--disable-usage-stats", "--num-cpus", "1",
                                 "--object-store-memory", str(80 * 1024 * 1024), *args],
                                stdout=fh, stderr=subprocess.STDOUT, env=ENV, start_new_session=True)
    node = Node(proc, psutil.Process(proc.pid).create_time(), log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if wait_for in text:
            return node, text
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    node.stop()
    raise AssertionError(f"ray start ({name}) did not come up within {timeout:g} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, object]]:
    folder = Path(tempfile.mkdtemp(prefix="hr-"))  # short: Ray's socket paths live under it
    nodes: list[Node] = []
    try:
        head, text = _start(["--head", "--port", "0", "--include-dashboard", "false", "--temp-dir", str(folder),
                             "--resources", json.dumps({"harvest_test_head": 1})], folder, "head",
                            "Ray runtime started")
        nodes.append(head)
        match = re.search(r"ray start --address='([^']+)'", text)
        assert match, text
        address = match.group(1)
        worker, _ = _start(["--address", address, "--resources", json.dumps({"harvest_test_worker": 1})],
                           folder, "worker", "Ray runtime started")
        nodes.append(worker)
        yield {"address": address, "head": head, "worker": worker}
    finally:
        for node in reversed(nodes):
            node.stop()
        for node in nodes:
            assert not node.members(), f"processes of {node.log.stem} outlived its stop"
        shutil.rmtree(folder, ignore_errors=True)


def harvest_cli(*args: str, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([sys.executable, "-m", "harvest", *args], check=False, capture_output=True, text=True,
                               env=ENV, timeout=timeout)


def _two_nodes(address: str) -> dict:
    """``harvest gpus --cluster --json`` once the worker shows up in the cluster's table (bounded)."""
    deadline = time.monotonic() + 90
    while True:
        done = harvest_cli("gpus", "--cluster", address, "--json")
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        if len(doc["places"]) == 2 or time.monotonic() > deadline:
            return doc
        time.sleep(2)


def test_gpus_lists_every_node_with_the_local_no_gpu_line(cluster: dict) -> None:
    doc = _two_nodes(str(cluster["address"]))
    place_answers(doc, "harvest.gpus/2")  # the documented shapes, as on this machine
    assert doc["placement"] == "ray"
    nodes = doc["places"]
    assert len(nodes) == 2, nodes
    # The custom resources tell the nodes apart: the head's task and the worker's task both answered.
    assert sorted(k for n in nodes for k in n["resources"] if k.startswith("harvest_test_")) == \
        ["harvest_test_head", "harvest_test_worker"]
    local = only_answer(harvest_cli("gpus", "--json").stdout)
    for n in nodes:
        assert n["error"] is None and n["answer"]["schema"] == "harvest.gpus/1"
        assert n["answer"]["gpus"] == local["gpus"] == []  # this CPU machine: no GPU, measured on each node
        assert n["answer"]["unavailable_reason"] == local["unavailable_reason"]
        assert n["answer"]["host"]["ram_total_mib"] == local["host"]["ram_total_mib"] > 0

    table = harvest_cli("gpus", "--cluster", str(cluster["address"]))
    assert table.returncode == 0, table.stderr
    for n in nodes:
        label = n["where"]
        assert label.startswith("node ") and label.endswith(f"({n['node_id'][:8]})")
        row = next(line for line in table.stdout.splitlines() if label in line and "no GPUs" in line)
        assert local["unavailable_reason"][:40] in row, table.stdout
        assert f"{label}: host RAM" in table.stdout


def test_preflight_runs_the_rules_on_every_node(cluster: dict, tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('[server]\nengine = "command"\ncommand = ["true"]\nhealth_url = "http://127.0.0.1:9/health"\n\n'
                   "[preflight]\nmin_disk_free_gib = 1000000.0\n")
    done = harvest_cli("preflight", str(job), "--cluster", str(cluster["address"]), "--json")
    assert done.returncode == 1, done.stdout + done.stderr  # no node has a petabyte free
    doc = json.loads(done.stdout)
    place_answers(doc, "harvest.preflight/2")
    assert doc["passed"] is False and len(doc["places"]) == 2
    for n in doc["places"]:
        disk = [r for r in n["answer"]["results"] if r["rule"] == "disk"]
        assert disk and not disk[0]["passed"], n["answer"]["results"]
        assert disk[0]["numbers"]["min_disk_free_gib"] == 1000000.0  # this config's margin, sent to the node

    text = harvest_cli("preflight", str(job), "--cluster", str(cluster["address"]))
    assert text.returncode == 1
    for n in doc["places"]:
        assert f"FAIL on {n['where']}" in text.stdout, text.stdout


def test_a_closed_address_is_one_clear_line_at_once() -> None:
    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        t0 = time.monotonic()
        done = harvest_cli("gpus", "--cluster", f"127.0.0.1:{port}", timeout=60)
        took = time.monotonic() - t0
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert f"ray 127.0.0.1:{port}: connect failed" in done.stderr and "Traceback" not in done.stderr
    assert took < 20, took


def test_a_silent_address_is_bounded_by_the_timeout() -> None:
    with socket.socket() as s:  # accepts connections (the kernel's backlog) and never says a word
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        port = s.getsockname()[1]
        t0 = time.monotonic()
        done = harvest_cli("gpus", "--cluster", f"127.0.0.1:{port}", "--timeout", "4", timeout=120)
        took = time.monotonic() - t0
    assert done.returncode == 1, done.stderr
    # Ray's core logs its own attempts from a thread of its own, before or after harvest's verdict:
    # the verdict is the one "error:" line, and there is no traceback.
    verdicts = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(verdicts) == 1, done.stderr
    assert re.search(rf"^error: host ray 127\.0\.0\.1:{port}: connect failed after [4-9]\.\d s", verdicts[0]), \
        done.stderr
    assert "Traceback" not in done.stderr
    assert took < 40, took


def test_missing_ray_is_one_line_exit_2() -> None:
    code = ("import sys; sys.modules['ray'] = None; from harvest.cli.main import main; "
            "sys.argv = ['harvest', 'gpus', '--cluster', '127.0.0.1:1']; main()")
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, env=ENV,
                          timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == ("error: Ray is not installed: install the ray extra into harvest's environment "
                                   "(pip install -e '.[ray]' in the clone)")


def test_a_node_that_does_not_answer_is_named_with_the_time_waited(cluster: dict) -> None:
    """Last in the module: the worker's raylet is paused (SIGSTOP, a process of the group this test
    started), so the task pinned to it cannot run; the head still answers. 20 s: the head's answer
    took over 6 s on a 2-core machine under the suite's load."""
    worker: Node = cluster["worker"]  # type: ignore[assignment]
    raylets = [p for p in worker.members() if p.name() == "raylet"]
    assert len(raylets) == 1, [p.name() for p in worker.members()]
    raylet = raylets[0]
    raylet.suspend()
    try:
        done = harvest_cli("gpus", "--cluster", str(cluster["address"]), "--json", "--timeout", "20")
    finally:
        raylet.resume()
    assert done.returncode == 1, done.stderr
    nodes = json.loads(done.stdout)["places"]
    by_role = {next(k for k in n["resources"] if k.startswith("harvest_test_")): n for n in nodes}
    assert by_role["harvest_test_head"]["error"] is None
    silent = by_role["harvest_test_worker"]
    assert silent["answer"] is None and silent["error"].startswith("no answer within 20 s") and silent["waited_s"] >= 20
