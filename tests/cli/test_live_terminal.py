"""The live display in a real terminal (tmux, 130 x 45): what a person watching sees.

``harvest run`` on llama-server (behind a pause): while the server launches the panel names the launch phase
with a growing elapsed time; while it generates the progress bar advances; nothing else (preflight
rules, log lines) is ever drawn inside the panel's frame, and the panel is drawn once. ``harvest
serve`` and ``harvest stop`` on the fake engine: the launch phase live, then the stop's steps as
they happen. Every distinct screen is kept as a text file in the test's folder (screen-NNN.txt).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from harvest.server import RunStatus, StateFile
from tests import engines, harvest_process
from tests.cli.terminal import Screen, Terminal
from tests.server.helpers import FAKE_ENGINE

# Engines (llama-server, the fake engine) in a real terminal (tmux).
pytestmark = pytest.mark.engine

HARVEST = [sys.executable, "-m", "harvest"]
#: Text that belongs above the panel, never inside its frame.
OUTSIDE = re.compile(r"preflight: (PASS|FAIL)|^\s*│?\s*(PASS|FAIL|SKIP)\s+[a-z-]+\s{2,}|input: \d+ rows|"
                     r"stop requested|\(relaunch \d+ of \d+\)|run folder:|WARNING|Traceback|command exited")


def assert_clean_frames(screens: list[Screen], panels: int = 1) -> None:
    """No screen shows more than ``panels`` panels (a live panel redrawn below itself would), each
    whole, with nothing but the panel inside its frame."""
    framed = [s for s in screens if s.frames()]
    assert framed, "no screen showed the panel"
    for screen in framed:
        assert len(screen.frames()) <= panels, f"the panel is drawn more than once:\n{screen.text}"
        for index in range(len(screen.frames())):
            for line in screen.inside(index):
                assert line.startswith("│") and line.rstrip().endswith("│"), \
                    f"a line broke the frame:\n{screen.text}"
                assert not OUTSIDE.search(line), f"{line!r} is inside the panel:\n{screen.text}"


def watch(term: Terminal, until: float, *, stop_when: object = None) -> int | None:
    """Capture the screen every 0.25 s until the command exits (its status) or ``until`` passes."""
    while time.monotonic() < until:
        screen = term.capture()
        status = term.exit_status()
        if status is not None:
            return status
        if callable(stop_when) and stop_when(screen):
            return None
        time.sleep(0.25)
    return None


def growing(values: list[float]) -> bool:
    return len(values) >= 2 and values == sorted(values) and values[-1] > values[0]


@pytest.mark.engine
def test_run_on_a_real_engine_shows_the_launch_then_the_bar_and_nothing_inside_the_panel(
        tmp_path, llama_server_bin, tiny_gguf):
    n = 200
    data = tmp_path / "prompts.jsonl"  # named relative to the terminal's folder: screens free of tmp paths
    data.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Write about topic {i}."}) + "\n"
                            for i in range(n)))
    port = engines.free_port()
    # llama-server behind a pause standing for a large model's load: the launch phase lasts long
    # enough to be seen on several screens (the engine itself is ready in a second).
    command = ["sh", "-c", 'sleep 4; exec "$0" "$@"', llama_server_bin]
    job = tmp_path / "job.toml"
    job.write_text(f"""
[server]
engine = "llamacpp"
model = {json.dumps(str(tiny_gguf))}
command = {json.dumps(command)}
port = {port}
extra_args = ["-c", "4096"]
ready_timeout = 120
stop_grace = 5
stop_deadline = 60

[preflight]
min_disk_free_gib = 0.05

[data]
path = "prompts.jsonl"
id_field = "id"

[sampling]
max_tokens = 48

[client]
concurrency = 8

[run]
progress_interval = 0.5

[output]
dir = "run"
""")
    term = Terminal(tmp_path / "screens")
    try:
        term.start([*HARVEST, "run", "job.toml"], env={**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")},
                   cwd=tmp_path)
        status = watch(term, time.monotonic() + 900)
        if status is None:  # out of time: Ctrl-C, as a person would, so harvest stops its server
            term.send("C-c")
            status = watch(term, time.monotonic() + 120)
        screens = term.screens
        final = screens[-1].text
        assert status == 0, f"harvest run exited {status}:\n{final}"

        # The launch phase, named, with an elapsed time that grows while the server starts.
        launching = [s.phase("launching") for s in screens]
        live_launch = [p[1] for p in launching if p is not None and p[0] == "▶"]
        assert growing(live_launch), f"launch elapsed times seen: {live_launch}"
        launch_screen = next(s for s in screens if (s.phase("launching") or ("",))[0] == "▶")
        assert any("llamacpp pid" in line and "since spawn" in line for line in launch_screen.inside()), \
            launch_screen.text
        # The rules were printed above the panel, before the launch.
        assert any(any("preflight: PASS" in line for line in s.above()) for s in screens if s.frames())

        # Generation: the bar advances.
        done = []
        for s in screens:
            if (s.phase("generating") or ("",))[0] != "▶":
                continue
            m = next((re.search(r"━.*?(\d[\d,]*) / (\d[\d,]*)", line) for line in s.inside()
                      if re.search(r"━.*?\d / \d", line)), None)
            if m:
                done.append(int(m.group(1).replace(",", "")))
        assert growing(done), f"items seen while generating: {done}"
        assert done[0] < n

        assert_clean_frames(screens)
        # The end: the stop's verdict in the panel, the totals below it.
        last = screens[-1]
        assert any("stopping" in line and "CLEAN" in line for line in last.inside()), final
        assert re.search(rf"^OK .* = {n} of {n} unique input items", final, re.M), final
    finally:
        term.stop()
    docs = Path(__file__).resolve().parents[2] / "docs"
    _keep_for_docs(screens, docs, tmp_path, tiny_gguf)


def _neutral(text: str, folder: Path, model: Path | None = None) -> str:
    """The screen with the test's folder left out of paths and the model's path named ``tiny-model``
    (the frame's borders re-fitted). A path the engine's log line was cut in (``…``, the milestone's
    length) is named so too, its cut kept: nothing of the machine's cache folder is left."""
    if model is not None:
        cache = re.compile(re.escape(str(model.parent.parent)) + r"/[^\s'\"│]*")

        def named(line: str) -> str:
            return cache.sub(lambda m: "tiny-model…" if m.group(0).endswith("…") else "tiny-model",
                             line.replace(str(model), "tiny-model"))

        text = "\n".join((named(line)[:-1].ljust(len(line) - 1) + line[-1] if line.startswith("│") else named(line))
                         if named(line) != line else line for line in text.splitlines())
    lines = text.replace(f"{folder}/", "").splitlines()
    width = max((len(line) for line in lines if line.startswith("╰")), default=0)
    return "\n".join(line[:-1].ljust(width - 1, "─") + "╮" if line.startswith("╭") and width else line
                     for line in lines)


def _keep_for_docs(screens: list[Screen], docs: Path, folder: Path, model: Path | None = None) -> None:
    """With HARVEST_UPDATE_DOCS=1, write one screen of the launch and one of the generation to docs/."""
    if os.environ.get("HARVEST_UPDATE_DOCS") != "1":
        return
    screens = [Screen(s.at, _neutral(s.text, folder, model)) for s in screens]
    launch = [s for s in screens if (s.phase("launching") or ("",))[0] == "▶"]
    launch = [s for s in launch if "log:" in s.text] or launch  # one with the engine's step, if any
    gen = [s for s in screens if (s.phase("generating") or ("",))[0] == "▶"]
    parts = []
    if launch:
        parts.append("while the server launches:\n\n" + launch[len(launch) // 2].text.rstrip())
    if gen:
        parts.append("while it generates:\n\n" + gen[len(gen) // 2].text.rstrip())
    (docs / "live-display.txt").write_text("\n\n\n".join(parts) + "\n")


def _fake_config(path: Path, pid_dir: Path, port: int, *flags: str) -> Path:
    pid_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(FAKE_ENGINE), "--host", "{host}", "--port", "{port}", "--pid-dir", str(pid_dir),
               *flags]
    path.write_text("[server]\nengine = \"command\"\n"
                    f"command = {json.dumps(command)}\n"
                    'health_url = "http://{host}:{port}/health"\n'
                    f"port = {port}\nready_timeout = 60\nstop_grace = 3\nstop_deadline = 20\n"
                    "[preflight]\nmin_disk_free_gib = 0.05\n")
    return path


def test_serve_shows_the_launch_live_then_the_stop_after_ctrl_c(tmp_path):
    port = engines.free_port()
    cfg = _fake_config(tmp_path / "server.toml", tmp_path / "pids", port, "--ready-after", "4")
    run_dir = tmp_path / "run"
    term = Terminal(tmp_path / "screens")
    try:
        term.start([*HARVEST, "serve", str(cfg), "--run-dir", str(run_dir)],
                   env={**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}, cwd=tmp_path)
        status = watch(term, time.monotonic() + 90, stop_when=lambda s: "ready:" in s.text)
        assert status is None, f"harvest serve exited {status}:\n{term.screens[-1].text}"
        live = [p[1] for p in (s.phase("launching") for s in term.screens) if p is not None and p[0] == "▶"]
        assert growing(live), f"launch elapsed times seen: {live}"
        assert any("waiting on GET" in "".join(s.inside()) for s in term.screens if s.frames())
        assert StateFile(run_dir).read().status is RunStatus.READY
        term.send("C-c")
        status = watch(term, time.monotonic() + 60)
        assert status == 0, term.screens[-1].text
        final = term.screens[-1]
        assert "verdict: CLEAN" in final.text
        # The launch's panel stays as it ended; the stop has its own below it.
        assert any("stopping" in line and "CLEAN" in line for line in final.inside(-1)), final.text
        assert any("launching" in line and "ready in" in line for line in final.inside(0)), final.text
        assert_clean_frames(term.screens, panels=2)
    finally:
        term.stop()


def test_stop_shows_each_step_as_it_happens(tmp_path):
    port = engines.free_port()
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}
    cfg = _fake_config(tmp_path / "server.toml", tmp_path / "pids", port, "--trap-term")
    run_dir = tmp_path / "run"
    import subprocess

    served = harvest_process.run([*HARVEST, "serve", str(cfg), "--run-dir", str(run_dir), "--detach"], env=env,
                                 capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL)
    assert served.returncode == 0, served.stdout + served.stderr
    assert "[harvest] launching" in served.stderr  # off a terminal: one plain line per phase change
    term = Terminal(tmp_path / "screens")
    try:
        term.start([*HARVEST, "stop", str(run_dir), "--grace", "3"], env=env, cwd=tmp_path)
        status = watch(term, time.monotonic() + 60)
        assert status == 0, term.screens[-1].text
        # While the engine ignored SIGTERM: the sigterm step printed above, the grace step running.
        during = [s for s in term.screens if s.frames() and any("step grace" in line for line in s.inside())]
        assert during, "\n\n".join(s.text for s in term.screens)
        assert any("sigterm" in line and "sent to group" in line for line in during[0].above())
        final = term.screens[-1].text
        for step in ("record", "sigterm", "grace", "sigkill", "reap", "port"):
            assert re.search(rf"^\s+{step}\s+\d+\.\d+ s", final, re.M), (step, final)
        assert "verdict: CLEAN" in final and "escalated to SIGKILL" in final
        assert_clean_frames(term.screens)
    finally:
        term.stop()
        if StateFile(run_dir).exists() and StateFile(run_dir).read().status is not RunStatus.STOPPED:
            from harvest.server import stop_run

            stop_run(run_dir, deadline=15)


SIM_ENGINE = Path(__file__).resolve().parents[2] / "bench" / "sim_engine.py"
ENDPOINTS = Path(__file__).resolve().parents[2] / "docs" / "endpoints.md"
#: What docs/endpoints.md promises of the panel's "claimed ahead" (dispatch.py ``_refill``: claims up to
#: ``CLAIM_FACTOR`` x the client's capacity, never given back when an auto target falls).
CLAIM_BOUND = "Sent and claimed ahead together stay within twice the highest concurrency of the session so far"


def _start_sim(folder: Path) -> tuple[object, str]:
    """bench/sim_engine.py on a port it picks and prints: an endpoint harvest does not manage, slow
    enough (4 at a time, 0.05 s a token) that requests queue in harvest while the panel is watched."""
    import subprocess

    log = open(folder / "sim.log", "w")  # noqa: SIM115 - closed with the process below
    proc = subprocess.Popen([sys.executable, str(SIM_ENGINE), "--port", "0", "--token-latency", "0.05",
                             "--max-batch", "4", "--output-tokens", "3", "--model", "sim-model"], stdout=subprocess.PIPE, stderr=log,
                            text=True, start_new_session=True)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    m = re.search(r"listening on ([\d.]+):(\d+)", line)
    assert m, f"the simulated engine did not start: {line!r}"
    proc._log = log  # type: ignore[attr-defined]
    return proc, f"http://{m.group(1)}:{m.group(2)}"


def _stop_sim(proc: object) -> None:
    import signal
    import subprocess

    assert isinstance(proc, subprocess.Popen)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # the group this test started
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
    proc._log.close()  # type: ignore[attr-defined]


def _load(screen: Screen) -> tuple[int, int] | None:
    """(sent, queued in harvest) from the panel's load row, None when it shows none."""
    for line in screen.inside():
        m = re.search(r"load\s+sent (\d+) \(concurrency (\d+)\)(?:, (\d+) more claimed ahead)?", line)
        if m:
            return int(m.group(1)), int(m.group(3) or 0)
    return None


def _exited(term: Terminal, until: float) -> int | None:
    """The command's own exit status: :func:`watch`, then the screen read again until the shell's
    exit mark shows (the pane can be dead, status 0 of the shell, a moment before it is captured)."""
    status = watch(term, until)
    for _ in range(20):
        if "[command exited" in term.capture().text:
            return term.exit_status()
        time.sleep(0.25)
    return status


def test_run_against_a_running_endpoint_shows_sent_the_resume_line_and_the_final_phase(tmp_path):
    concurrency, n = 4, 120
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Topic {i}."}) + "\n"
                                                    for i in range(n)))
    sim, url = _start_sim(tmp_path)
    (tmp_path / "job.toml").write_text(f"""
[server]
engine = "openai"
base_url = "{url}"
model = "sim-model"

[data]
path = "prompts.jsonl"

[sampling]
max_tokens = 6

[client]
concurrency = {concurrency}

[run]
progress_interval = 0.5

[output]
dir = "run"
""")
    env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}
    try:
        # First session: interrupted with Ctrl-C once a part is done.
        term = Terminal(tmp_path / "screens-1")
        try:
            term.start([*HARVEST, "run", "job.toml"], env=env, cwd=tmp_path)

            def some_done(s: Screen) -> bool:
                m = re.search(r"━.*?(\d+) / \d+", s.text)
                return m is not None and int(m.group(1)) >= 20

            assert watch(term, time.monotonic() + 120, stop_when=some_done) is None, term.screens[-1].text
            term.send("C-c")
            status = _exited(term, time.monotonic() + 60)
            assert status == 130, term.screens[-1].text
            loads = [x for x in (_load(s) for s in term.screens) if x is not None]
            assert loads, "no screen showed what is sent:\n" + term.screens[-1].text
            assert all(sent <= concurrency for sent, _ in loads), loads  # never more than the concurrency
            assert any(queued > 0 for _, queued in loads), loads  # the claim-ahead shown apart
            # Within the guide's bound: sent and claimed ahead together at most twice the highest
            # concurrency so far (fixed here; every prompt is its own prefix, so no 2,048 window).
            stated = ENDPOINTS.read_text().replace("\n", " ")
            assert CLAIM_BOUND in stated, "docs/endpoints.md no longer states the bound"
            assert all(sent + queued <= 2 * concurrency for sent, queued in loads), loads
            final = term.screens[-1].text
            assert "run `harvest run job.toml` again to resume" in final, final
            assert any("generating" in line and "stopped: interrupted" in line for line in term.screens[-1].inside())
            assert_clean_frames(term.screens)
        finally:
            term.stop()

        # Second session: says what it found and what it does, then ends with the phase finished.
        term = Terminal(tmp_path / "screens-2")
        try:
            term.start([*HARVEST, "run", "job.toml"], env=env, cwd=tmp_path)
            status = _exited(term, time.monotonic() + 180)
            assert status == 0, term.screens[-1].text
            resume = [re.search(r"resuming: (\d+) done, (\d+) pending.*", s.text) for s in term.screens]
            found = next((m for m in resume if m), None)
            assert found, term.screens[-1].text
            done, pending = int(found.group(1)), int(found.group(2))
            assert done >= 20 and done + pending == n, (done, pending)
            assert found.group(0).endswith(f"; generating the {pending} pending"), found.group(0)
            last = term.screens[-1]
            generating = [line for line in last.inside() if re.search(r"[✓✗]\s+generating", line)]
            assert generating and "finished" in generating[0], last.text
            assert not any("sending requests" in line for line in last.inside()), last.text
            assert not re.search(r"server running [1-9]", "\n".join(last.inside())), last.text
            assert re.search(rf"^OK .* = {n} of {n} unique input items", last.text, re.M), last.text
            assert_clean_frames(term.screens)
        finally:
            term.stop()
    finally:
        _stop_sim(sim)


def test_after_a_relaunch_the_panel_shows_it_and_a_running_phase_and_ended_only_at_the_end(
        tmp_path, llama_server_bin, tiny_gguf):
    """llama-server SIGKILLed (its whole group, from the launch record) mid-run: harvest relaunches
    it, and the phase rows say so: the launch row names the relaunch, generating runs again with
    the reason, the stop row says it came before the relaunch; no row says "ended" before the end."""
    n = 400
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Topic {i}."}) + "\n"
                                                    for i in range(n)))
    (tmp_path / "job.toml").write_text(f"""
[server]
engine = "llamacpp"
model = {json.dumps(str(tiny_gguf))}
command = {json.dumps([llama_server_bin])}
port = {engines.free_port()}
max_running_requests = 4
extra_args = ["-c", "8192"]
stop_grace = 2
stop_deadline = 30

[preflight]
min_disk_free_gib = 0.05
ram_reserve_gib = 0

[data]
path = "prompts.jsonl"
id_field = "id"

[sampling]
max_tokens = 32

[client]
concurrency = 4

[run]
progress_interval = 0.5

[output]
dir = "run"
""")
    term = Terminal(tmp_path / "screens")
    try:
        term.start([*HARVEST, "run", "job.toml"], env={**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")},
                   cwd=tmp_path)

        def some_done(screen: Screen) -> bool:
            m = re.search(r"━.*?(\d+) / \d+", screen.text)
            return m is not None and int(m.group(1)) >= 60

        assert watch(term, time.monotonic() + 180, stop_when=some_done) is None, term.screens[-1].text
        record = json.loads((tmp_path / "run" / "server" / "launch.json").read_text())["record"]
        os.killpg(record["pgid"], signal.SIGKILL)  # the group harvest launched, from its own record
        status = _exited(term, time.monotonic() + 600)
        screens = term.screens
        assert status == 0, screens[-1].text

        def row(screen: Screen, name: str) -> str:
            """The phase row ``name`` with the lines its text wrapped onto (they start with blanks
            where the next row's mark would be), joined."""
            lines = list(screen.inside())
            for i, line in enumerate(lines):
                if re.search(rf"[▶✓✗]\s+{name}\b", line):
                    parts = [line.strip("│ ")]
                    for more in lines[i + 1:]:
                        body = more.strip("│")
                        if not body.strip() or re.match(r"\s*[▶✓✗·]", body) or not body.startswith("   "):
                            break
                        parts.append(body.strip())
                    return " ".join(parts)
            return ""

        after = [s for s in screens if "relaunch 1 of" in row(s, "launching") and row(s, "generating")
                 .lstrip("│ ").startswith("▶")]
        assert after, "no screen showed the relaunch with generating running:\n" + screens[-1].text
        shown = after[0]
        assert "sending requests again after relaunch 1 of" in row(shown, "generating"), shown.text
        assert "the server exited" in row(shown, "generating"), shown.text
        assert "before relaunch 1 of" in row(shown, "stopping"), shown.text
        running = [s for s in screens if "[command exited" not in s.text and s.frames()]
        for screen in running[:-1]:  # the last panels drawn may be those of the ended run
            assert not any(re.search(r"\bended\b", line) for line in screen.inside()), screen.text
        last = screens[-1]
        assert "finished" in row(last, "generating"), last.text
        assert re.search(rf"^OK .* = {n} of {n} unique input items", last.text, re.M), last.text
        assert "server relaunched 1 time(s)" in last.text, last.text
        assert_clean_frames(screens)
    finally:
        term.stop()
