"""The launch record: redaction, the state file (private, atomic, locked updates), the run index."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from harvest.errors import StopError
from harvest.server.state import (
    LaunchRecord,
    ProcessRef,
    RunState,
    RunStatus,
    StateFile,
    list_runs,
    make_run_dir,
    redact_argv,
    register_run,
    state_dir,
)


def record(**kw: object) -> LaunchRecord:
    values: dict[str, object] = dict(
        engine="vllm", pid=1234, pgid=1234, create_time=1700000000.25, argv=("python", "-m", "x"),
        host="127.0.0.1", port=8000, url="http://127.0.0.1:8000", gpus=(0, 1), baseline_mib={0: 615, 1: 3},
        engine_version="0.32.0", started_at=1700000001.0, log_path="server.log", stop_grace=10.0,
        stop_deadline=60.0)
    values.update(kw)
    return LaunchRecord(**values)  # type: ignore[arg-type]


def test_redact_argv():
    argv = ["srv", "--api-key", "k1", "--api-key=k2", "--token", "sekrit", "--url", "http://u:sekrit@h"]
    assert redact_argv(argv, ["sekrit"]) == (
        "srv", "--api-key", "***", "--api-key=***", "--token", "***", "--url", "http://***@h")
    assert redact_argv(["a", "b"], [""]) == ("a", "b")


def test_state_file_round_trip_is_private(tmp_path):
    held = make_run_dir(tmp_path / "run")
    run = held.path
    assert stat.S_IMODE(os.stat(run).st_mode) == 0o700
    sf = StateFile(held)
    written = sf.write(RunState(record=record(), status=RunStatus.STARTING))
    assert stat.S_IMODE(os.stat(sf.path).st_mode) == 0o600
    back = sf.read()
    assert back == written
    assert back.record.baseline_mib == {0: 615, 1: 3} and back.record.gpus == (0, 1)
    assert [p.name for p in run.iterdir() if p.name.endswith(".tmp")] == []


def test_add_descendants_records_each_process_once(tmp_path):
    sf = StateFile(make_run_dir(tmp_path / "run"))
    sf.write(RunState(record=record(), status=RunStatus.READY))
    sf.add_descendants([ProcessRef(2000, 1700000002.5, "EngineCore"), ProcessRef(1234, 1700000000.25)])
    sf.add_descendants([ProcessRef(2000, 1700000002.51, "EngineCore"), ProcessRef(2000, 1700009999.0, "reused")])
    assert [(p.pid, p.name) for p in sf.read().descendants] == [(2000, "EngineCore"), (2000, "reused")]
    assert sf.set_status(RunStatus.STOPPING).status is RunStatus.STOPPING


def test_unreadable_or_missing_record_is_a_stop_error(tmp_path):
    with pytest.raises(StopError, match="no launch record"):
        StateFile(tmp_path).read()
    (tmp_path / "launch.json").write_text(json.dumps({"record": {}}))
    with pytest.raises(StopError, match="unreadable"):
        StateFile(tmp_path).read()


def test_state_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("HARVEST_STATE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "x"))
    assert state_dir() == tmp_path / "a"
    monkeypatch.delenv("HARVEST_STATE_DIR")
    assert state_dir() == tmp_path / "x" / "harvest"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert state_dir() == Path.home() / ".local" / "state" / "harvest"


def test_index_lists_registered_run_dirs_that_still_exist(tmp_path, harvest_state_dir):
    a, b = make_run_dir(tmp_path / "a").path, make_run_dir(tmp_path / "b").path
    register_run(a, "vllm", 8000)
    register_run(b, "command", 8001)
    assert [(Path(e.run_dir).name, e.engine, e.port) for e in list_runs()] == [("a", "vllm", 8000),
                                                                              ("b", "command", 8001)]
    b.rmdir()
    assert [Path(e.run_dir).name for e in list_runs()] == ["a"]
    assert not str(harvest_state_dir).startswith(str(Path.home() / ".local"))


def test_recorder_pruning_drops_exited_descendants_only(tmp_path):
    sf = StateFile(make_run_dir(tmp_path / "run"))
    sf.write(RunState(record=record(), status=RunStatus.READY,
                      descendants=(ProcessRef(2000, 1.0, "gone"), ProcessRef(2001, 2.0, "alive"))))
    before = sf.path.stat().st_mtime_ns
    unchanged = sf.add_descendants([ProcessRef(2001, 2.0)], keep=lambda r: True)
    assert sf.path.stat().st_mtime_ns == before and len(unchanged.descendants) == 2  # no write
    after = sf.add_descendants([ProcessRef(2002, 3.0, "new")], keep=lambda r: r.name != "gone")
    assert [d.name for d in after.descendants] == ["alive", "new"]
    assert sf.read() == after


def test_a_run_folder_launched_again_is_listed_once(tmp_path, harvest_state_dir):
    # a relaunch (or a later session) registers the folder again: `harvest ps --all` showed its
    # server once per registration
    import json as _json

    from click.testing import CliRunner

    from harvest.cli.main import cli
    from harvest.server.state import RunState, RunStatus, StateFile

    run = make_run_dir(tmp_path / "run").path
    StateFile(run).write(RunState(record=record(pid=999_999, pgid=999_999, gpus=(), baseline_mib={}),
                                  status=RunStatus.STOPPED))
    for port in (8000, 8000, 8001):
        register_run(run, "vllm", port)
    assert [(Path(e.run_dir).name, e.port) for e in list_runs()] == [("run", 8001)]
    out = CliRunner().invoke(cli, ["ps", "--all", "--json"])
    assert out.exit_code == 0, out.output
    servers = _json.loads(out.stdout)["servers"]
    assert [Path(s["run_dir"]).name for s in servers] == ["run"], servers
