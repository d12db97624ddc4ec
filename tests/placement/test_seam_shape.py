"""The placement seam's shape: no command wording in it, refusals that are proper ConfigErrors of one
line, one launch-and-stop for every fleet of one server, and preflight results read by their types.

- no ``getattr`` / ``hasattr`` on a preflight result anywhere in src (a RuleResult's or a
  PreflightReport's fields, PreflightFailed's): the records are typed (harvest.checks);
- no ``ServeWords`` / ``serve_dir`` / ``serve_words`` under placement/: ``harvest serve``'s words
  and folder are the command's (cli/serve.py), from the one neutral fact ``Placement.here``;
- no exception skips its parent's ``__init__`` (``Exception.__init__(self, ...)``);
- the on_preflight callables of the launch seams take a PreflightReport (``OnPreflight``).

Each source scan has a self-test that plants what it looks for. The fleet test launches a real
process (tests/server/fake_engine.py, a ``command`` engine) through the local placement's factory.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import pickle
import socket
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest

from harvest.checks import PreflightReport, RuleResult
from harvest.cli.serve import serve_dir, serve_words
from harvest.config import HostConfig, ServerConfig
from harvest.errors import ConfigError, LaunchError, PreflightFailed
from harvest.placement import FleetFactory, OnPreflight, Refused
from harvest.placement.base import Fleet
from harvest.placement.local import LocalFleet, LocalPlacement
from harvest.placement.ray.cluster import ClusterError
from harvest.placement.ray.fleet import RayFleet
from harvest.placement.ssh import SshPlacement
from harvest.placement.ssh.fleet import SshFleet, SshGroupFleet
from harvest.placement.ssh.servers import RemoteServer, far_preflight
from harvest.server import Server
from tests.engines import free_port
from tests.server.helpers import TEST_PREFLIGHT, fake_config, gone

SRC = Path(__file__).resolve().parents[2] / "src" / "harvest"

#: What a preflight result answers: every field of the records, and PreflightFailed's views.
RESULT_NAMES = ({f.name for f in dataclasses.fields(RuleResult)} | {f.name for f in dataclasses.fields(PreflightReport)}
                | {"passed", "failures", "failed_rules"})
SERVE_WORDING = {"ServeWords", "serve_dir", "serve_words"}


def _files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py"))


def _nodes(root: Path) -> Iterator[tuple[Path, ast.AST]]:
    """Every syntax node of every module under ``root``, with its file."""
    for f in _files(root):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            yield f, node


def result_probes(root: Path) -> list[str]:
    """``getattr(x, "passed", ...)`` / ``hasattr(x, "rule")``: a probe of a preflight result's field."""
    found = []
    for f, node in _nodes(root):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant) and node.args[1].value in RESULT_NAMES):
            found.append(f"{f.relative_to(root)}:{node.lineno} {ast.unparse(node)}")
    return found


def serve_wording(root: Path) -> list[str]:
    """Every definition or use of harvest serve's words under ``root``."""
    found = []
    for f, node in _nodes(root):
        name = (node.name if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                else node.id if isinstance(node, ast.Name)
                else node.attr if isinstance(node, ast.Attribute)
                else node.name if isinstance(node, ast.alias) else None)
        if name in SERVE_WORDING:
            found.append(f"{f.relative_to(root)}:{getattr(node, 'lineno', '?')} {name}")
    return found


def skipped_inits(root: Path) -> list[str]:
    """``SomeClass.__init__(self, ...)``: an ``__init__`` that names a class instead of ``super()``."""
    found = []
    for f, node in _nodes(root):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__init__"
                and isinstance(node.func.value, ast.Name)):
            found.append(f"{f.relative_to(root)}:{node.lineno} {ast.unparse(node)}")
    return found


def untyped_on_preflight(root: Path) -> list[str]:
    """A parameter or attribute ``on_preflight`` annotated other than ``OnPreflight | None``."""
    found = []
    for f, node in _nodes(root):
        if isinstance(node, ast.arg) and node.arg == "on_preflight":
            hint = ast.unparse(node.annotation) if node.annotation is not None else "(none)"
        elif (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Attribute)
              and node.target.attr == "on_preflight"):
            hint = ast.unparse(node.annotation)
        else:
            continue
        if hint not in ("OnPreflight | None", "Callable[[PreflightReport], None] | None"):
            found.append(f"{f.relative_to(root)}:{node.lineno} on_preflight: {hint}")
    return found


PLANTED = '''
class ServeWords: ...
def serve_dir(placement): return placement.serve_words
def passed(r, report, exc):
    Exception.__init__(exc, "x")
    return getattr(r, "passed", True) and hasattr(report, "failures")
def launch(on_preflight: Callable[[object], None] | None = None): ...
'''


def test_the_scans_find_what_they_look_for(tmp_path):
    (tmp_path / "planted.py").write_text(PLANTED)
    assert len(result_probes(tmp_path)) == 2
    assert {w.split()[-1] for w in serve_wording(tmp_path)} == SERVE_WORDING
    assert len(skipped_inits(tmp_path)) == 1
    assert untyped_on_preflight(tmp_path) == ["planted.py:7 on_preflight: Callable[[object], None] | None"]


def test_no_probe_of_a_preflight_result_in_src():
    assert result_probes(SRC) == []


def test_placement_holds_no_serve_wording():
    assert serve_wording(SRC / "placement") == []
    assert LocalPlacement.here and not SshPlacement.here  # the one fact harvest serve asks


def test_no_exception_skips_its_parents_init():
    assert skipped_inits(SRC) == []


def test_the_launch_seams_tell_a_typed_preflight_report():
    for part in ("placement", "server", "cli", "campaign/sweep"):
        assert untyped_on_preflight(SRC / part) == [], part
    hints = typing.get_type_hints(FleetFactory.__call__)
    assert hints["on_preflight"] == OnPreflight | None
    assert typing.get_type_hints(far_preflight)["return"] is PreflightReport
    assert typing.get_type_hints(RemoteServer.preflight)["return"] is PreflightReport
    assert typing.get_type_hints(Server.__init__)["on_preflight"] == OnPreflight | None
    assert "adapter" not in vars(RemoteServer)  # the fleet's adapter (typed) answers for it
    assert typing.get_type_hints(Fleet.adapter.fget)["return"].__name__ == "EngineAdapter"


@pytest.mark.parametrize("refusal", [
    Refused("--watch", "refreshes this machine's view"),
    ClusterError("job.toml", "--watch", "refreshes this machine's view"),
])
def test_a_refusal_is_a_config_error_of_one_line(refusal):
    assert isinstance(refusal, ConfigError)
    assert str(refusal) == "--watch: refreshes this machine's view"
    assert refusal.problems == [("--watch", "refreshes this machine's view")]
    assert refusal.source in ("--watch", "job.toml")


def _port_refusal(tmp_path: Path) -> PreflightFailed:
    """A launch refused by the measured port rule: the port is held by a listening socket here."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    try:
        port = holder.getsockname()[1]
        server = Server(fake_config(tmp_path / "pids", port=port), run_dir=tmp_path / "run", preflight=TEST_PREFLIGHT)
        with pytest.raises(PreflightFailed) as info:
            server.launch()
        assert server.pid is None  # refused before anything was spawned
        return info.value
    finally:
        holder.close()


def test_a_preflight_refusal_is_typed_and_crosses_a_pickle(tmp_path):
    exc = _port_refusal(tmp_path)
    assert exc.failed_rules == ["port"]
    assert all(isinstance(r, RuleResult) and not r.passed for r in exc.failures)
    assert len(exc.results) > len(exc.failures)  # every rule is carried, the passed ones too
    assert str(exc).startswith("preflight failed: port: ")
    again = pickle.loads(pickle.dumps(exc))  # raised in a Ray actor, it reaches the driver pickled
    assert again.failed_rules == ["port"] and again.results == exc.results and str(again) == str(exc)


def test_fleets_of_one_server_share_the_base_launch_and_stop():
    for one in (LocalFleet, SshFleet):
        assert one._start is Fleet._start and one._stop is Fleet._stop, one
    for group in (SshGroupFleet, RayFleet):
        assert group._start is not Fleet._start and group._stop is not Fleet._stop, group


def _launch(tmp_path: Path, name: str, *flags: str, **server: object) -> tuple[Fleet, BaseException | None]:
    """A fake engine launched through the local placement's factory (another port when the chosen
    one was taken between choosing and binding)."""
    make = LocalPlacement().fleet()
    for attempt in range(4):
        fleet = make(fake_config(tmp_path / name, *flags, port=free_port(), **server),
                     run_dir=tmp_path / f"{name}-{attempt}", preflight=TEST_PREFLIGHT)
        try:
            asyncio.run(fleet.start())
        except PreflightFailed as exc:
            if exc.failed_rules == ["port"]:
                continue
            return fleet, exc
        except LaunchError as exc:
            if exc.reason == "port_in_use":
                continue
            return fleet, exc
        return fleet, None
    raise AssertionError("no free port after 4 attempts")


def test_a_local_fleet_launches_and_stops_through_the_base(tmp_path):
    fleet, error = _launch(tmp_path, "served")
    assert error is None and fleet.ready is not None
    pid = fleet.placed()[0]["pid"]
    reports = asyncio.run(fleet.stop())
    assert len(reports) == 1 and reports[0].clean, reports
    assert gone(pid)
    assert asyncio.run(fleet.stop()) == reports  # idempotent: the same one report


def test_a_failed_local_launch_keeps_its_stop_report(tmp_path):
    fleet, error = _launch(tmp_path, "late", "--ready-after", "60", ready_timeout=2.0)
    assert isinstance(error, LaunchError) and error.reason == "timeout"
    (report,) = fleet.stop_reports  # kept by the base's _start: what the failed launch started, stopped
    assert report.clean, report
    record = fleet.launch_record()
    assert record is not None and gone(record.leader.pid, record.leader.create_time)


def test_serve_folder_and_words_are_the_commands(tmp_path, monkeypatch):
    monkeypatch.setenv("HARVEST_STATE_DIR", str(tmp_path / "state"))
    cfg = ServerConfig(engine="vllm", model="m", port=8123)
    here, far = LocalPlacement(), SshPlacement([HostConfig(ssh="root@box")])
    assert serve_words(here, cfg).target == cfg.url and serve_words(here, cfg).refused_on == ""
    assert serve_words(far, cfg).target == "root@box" and serve_words(far, cfg).refused_on == " on root@box"
    assert serve_dir(here, cfg, None, run_name="mine") == tmp_path / "state" / "servers" / "mine"
    assert serve_dir(here, cfg, None).parent == tmp_path / "state" / "servers"
    assert serve_dir(far, cfg, None).parent == tmp_path / "state" / "placed"
    assert serve_dir(far, cfg, tmp_path / "given") == tmp_path / "given"
    with pytest.raises(Refused) as info:
        serve_dir(far, cfg, None, run_name="mine")
    assert "\n" not in str(info.value) and "it chooses both itself" in str(info.value)
