"""The supervisor and the stop report their phases through the event seam (harvest.events), as
they happen, from a real launch of the fake engine: preflight's verdict, the launch with the pid,
the engine's log line and the readiness check waited on, then the stop's steps in order."""

from __future__ import annotations

from harvest.events import Event
from harvest.server import stop_run
from tests.server.helpers import fake_config


def test_launch_and_stop_report_their_phases_in_order(launcher, tmp_path):
    events: list[Event] = []
    server = launcher.launch(lambda port: fake_config(tmp_path / "pids", "--ready-after", "1.5", port=port),
                             on_event=events.append)
    kinds = [(e.phase, e.kind) for e in events]
    assert kinds[:3] == [("preflight", "start"), ("preflight", "end"), ("launching", "start")], kinds
    assert kinds[-1] == ("launching", "end") and events[-1].ok
    preflight = events[1].info
    assert preflight["passed"] is True and preflight["rules"] >= 1 and preflight["failures"] == 0
    assert events[2].info["pid"] == server.pid and events[2].info["engine"] == "command"
    updates = [e.info for e in events if e.kind == "update"]
    assert updates, "no launching update while /health answered 503 for 1.5 s"
    assert any(u["waiting_on"] == "GET /health" for u in updates), updates  # its own address: the path
    # The last line of the engine's log that says a start-up step (not the pid line before it).
    assert updates[-1]["line"] == "fake-engine: listening", updates
    assert events[-1].info["seconds"] >= 1.5  # it waited for the 503s to end

    events.clear()
    report = server.shutdown()
    assert report is not None and report.clean
    assert (events[0].phase, events[0].kind) == ("stopping", "start")
    assert (events[-1].phase, events[-1].kind) == ("stopping", "end")
    assert events[-1].info["verdict"] == "clean" and events[-1].ok
    begun = [e.info["step"] for e in events if e.kind == "update" and e.info["outcome"] is None]
    ended = [e.info["step"] for e in events if e.kind == "update" and e.info["outcome"] is not None]
    assert ended == [s.name for s in report.steps]  # every step, in the order the report lists them
    assert begun[0] == "record" and begun[-1] == "port"
    for name in ended:  # each step was announced before it ended
        first_begin = next(i for i, e in enumerate(events) if e.info.get("step") == name)
        assert events[first_begin].info["outcome"] is None, name


def test_stop_run_tells_each_step_as_it_happens(launcher, tmp_path):
    server = launcher.launch(lambda port: fake_config(tmp_path / "pids", "--trap-term", port=port))
    heard: list[tuple[str, object]] = []
    report = stop_run(server.run_dir, deadline=10.0, grace=0.5, on_step=lambda name, step: heard.append((name, step)))
    assert report.escalated  # the engine ignored SIGTERM: grace, then SIGKILL and reap
    finished = [step for _, step in heard if step is not None]
    assert finished == list(report.steps)
    assert [n for n, s in heard if s is None] == ["record", "sigterm", "grace", "sigkill", "reap", "gpu", "port"]


def test_a_listener_that_raises_does_not_break_the_launch(launcher, tmp_path):
    heard: list[Event] = []

    def broken(event: Event) -> None:
        heard.append(event)
        raise RuntimeError("display failed")

    server = launcher.launch(lambda port: fake_config(tmp_path / "pids", port=port), on_event=broken)
    assert server.ready is not None
    launching = [e for e in heard if e.phase == "launching"]
    # it was called, raised every time, and still heard the launch through to its end
    assert launching and launching[0].kind == "start" and launching[-1].kind == "end", heard
    report = server.shutdown()
    assert report is not None and report.clean
    assert any(e.phase == "stopping" for e in heard), heard  # and the stop after it
