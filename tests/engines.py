"""Real engines for the tests: locate (installing on first use) vLLM's CPU build and llama-server,
build the tiny model, and run one engine process that the tests started and stop it by its group.

Plain functions, so fixtures and benchmarks share them. Everything started here is stopped here,
by the process group recorded at launch; nothing else is ever signalled.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from harvest.http import HttpError, SyncHttp

ROOT = Path(__file__).resolve().parents[1]

#: What the tests started and have not stopped yet: pid -> its stop. A SIGTERM to the test process
#: (a CI runner's timeout, ``kill`` by hand) stops these before it dies (``stop_started_on_sigterm``):
#: their own sessions keep them alive past the process that started them.
_STARTED: dict[int, Callable[[], None]] = {}
INSTALLER = ROOT / "scripts" / "install-engines"
MAKE_MODEL = ROOT / "src" / "harvest" / "demo" / "make_tiny_model.py"


def install_engine(name: str) -> str:
    """Path printed by the idempotent installer (a Python for vllm, the binary for llamacpp)."""
    proc = subprocess.run([str(INSTALLER), name], capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/install-engines {name} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout.strip().splitlines()[-1]


def cached_tiny_model(python: str) -> Path:
    """The tiny model, built once per version of its recipe (make_tiny_model.py's bytes) beside the
    cached engines, shared by every test process (pytest-xdist workers, later runs): built into a
    temporary folder under a lock, then renamed into place."""
    import fcntl
    import hashlib
    import shutil

    root = Path(os.environ.get("HARVEST_ENGINES") or Path.home() / ".cache" / "harvest" / "engines")
    root.mkdir(parents=True, exist_ok=True)
    recipe = hashlib.sha256(MAKE_MODEL.read_bytes()).hexdigest()[:16]
    final = root / f"tiny-model-{recipe}"
    with open(root / f".lock-tiny-model-{recipe}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # bounded by the build's own timeout in the holder
        if not (final / "model.gguf").exists():
            building = root / f".building-tiny-model-{recipe}-{os.getpid()}"
            shutil.rmtree(building, ignore_errors=True)
            build_tiny_model(python, building)
            shutil.rmtree(final, ignore_errors=True)
            building.rename(final)
    return final


def build_tiny_model(python: str, out: Path, gguf: bool = True) -> Path:
    """Build the tiny random model (HF folder, and model.gguf) with the engine's Python."""
    if (out / "config.json").exists() and (not gguf or (out / "model.gguf").exists()):
        return out
    args = [python, str(MAKE_MODEL), str(out)] + (["--gguf"] if gguf else [])
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"building the tiny model failed:\n{proc.stderr[-4000:]}")
    return out


def served_model(url: str) -> str:
    """The first model an OpenAI-compatible server lists at ``url`` (``/v1/models``)."""
    with SyncHttp(max_connections=1) as http:
        return str(http.get(url + "/v1/models", timeout=10).json()["data"][0]["id"])


def _port_pool() -> range:
    """This test process's own ports: outside the kernel's ephemeral range (which every ``bind(0)``
    and outgoing connection draws from) and, under pytest-xdist, a slice of its own per worker."""
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return range(0)
    pool = range(max(10000, low - 12000), low) if low > 12000 else range(high + 1, 65536)
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    size = len(pool) // max(1, count)
    return pool[index * size:(index + 1) * size] if size >= 50 else range(0)


_PORTS = _port_pool()
_NEXT_PORT = itertools.count(random.randrange(65536))  # a random start: no TIME_WAIT of the run before


def free_port() -> int:
    """A loopback port that was free a moment ago, for a server a test starts. Callers let the server
    bind it and retry on 'in use'. It is drawn from this process's own slice outside the ephemeral
    range: a vLLM binds its port long before it listens (the whole engine start), and a server
    elsewhere in the suite that binds port 0 meanwhile could otherwise be handed the same port and
    answer in the engine's place."""
    for _ in range(len(_PORTS)):
        port = _PORTS[next(_NEXT_PORT) % len(_PORTS)]
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # no pool here: any free port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class EngineProcess:
    """An engine server the tests started in its own session, stopped through its group."""

    argv: list[str]
    port: int
    model: str
    log_path: Path
    proc: subprocess.Popen
    create_time: float

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM the group, then SIGKILL it after ``grace``; verify the leader is gone."""
        pgid = self.proc.pid  # start_new_session: the leader's pid is the group id
        try:
            for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
                if self.proc.poll() is not None and not _group_alive(pgid):
                    return
                try:
                    os.killpg(pgid, sig)
                except ProcessLookupError:
                    return
                deadline = time.monotonic() + wait
                while time.monotonic() < deadline:
                    if self.proc.poll() is not None and not _group_alive(pgid):
                        return
                    time.sleep(0.1)
        finally:
            _STARTED.pop(self.proc.pid, None)


def _group_alive(pgid: int) -> bool:
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.info["pid"]) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


def start_engine(argv: list[str], *, port: int, model: str, log_path: Path, health: str,
                 env: dict[str, str] | None = None, timeout: float = 240.0) -> EngineProcess:
    """Start ``argv`` in a new session and wait (bounded) for ``health`` to answer 200."""
    log = open(log_path, "wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, env={**os.environ, **(env or {})})
    log.close()
    engine = EngineProcess(argv, port, model, log_path, proc, psutil.Process(proc.pid).create_time())
    _STARTED[proc.pid] = lambda: engine.stop(grace=5.0)
    deadline = time.monotonic() + timeout
    with SyncHttp(max_connections=1) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"engine exited with {proc.returncode} before ready:\n{engine.log_tail()}")
            try:
                if client.get(engine.url + health, timeout=2.0).status == 200:
                    return engine
            except HttpError:
                pass
            time.sleep(0.5)
    engine.stop()
    raise RuntimeError(f"engine not ready within {timeout:.0f} s:\n{engine.log_tail()}")


def start_vllm(python: str, model: Path, log_dir: Path, *extra: str, timeout: float) -> EngineProcess:
    """A vLLM CPU server on a free port; a port taken between choosing and binding: choose again."""
    last: Exception | None = None
    for _ in range(3):
        port = free_port()
        try:
            return start_engine(vllm_argv(python, str(model), port, *extra), port=port, model=str(model),
                                log_path=log_dir / "server.log", health="/health", env=VLLM_ENV,
                                timeout=timeout)
        except RuntimeError as exc:
            last = exc
            if "address already in use" not in str(exc).lower():
                raise
    raise RuntimeError(f"could not start vLLM: {last}")


def vllm_argv(python: str, model: str, port: int, *extra: str) -> list[str]:
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1",
            "--port", str(port), *extra]


def llama_argv(binary: str, gguf: str, port: int, *extra: str) -> list[str]:
    return [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "--metrics", "-np", "8",
            "-c", "16384", *extra]


# VLLM_ENABLE_V1_MULTIPROCESSING=0: the CPU build's model runner in its engine core, as vLLM runs one
# GPU (an API server and its EngineCore), instead of a third process that imports vLLM again: 33 s
# to ready and 32 s of CPU a launch instead of 51 s and 50 s (2-core AMD EPYC VM, 2026-12-07).
# One OpenMP thread, unbound (VLLM_CPU_OMP_THREADS_BIND=nobind, OMP_NUM_THREADS=1): the tiny model's
# steps are too small to share, and the suite keeps every core busy; 96 answers of 32 tokens took
# 6.9 s of the engine's CPU instead of 10.4 s, in 6.1 s instead of 5.6 s on an idle machine.
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}


def main() -> int:  # pragma: no cover - manual helper: python tests/engines.py
    py = install_engine("vllm")
    print(py, install_engine("llamacpp"), build_tiny_model(py, Path(sys.argv[1])))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


@contextmanager
def not_http_peer() -> Iterator[int]:
    """A loopback port whose one peer reads a request and answers bytes that are not HTTP; yields the port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(30)

    def serve() -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.recv(65536)
            conn.sendall(b"NOT HTTP AT ALL\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        thread.join(30)
        listener.close()


SIM_ENGINE = Path(__file__).resolve().parents[1] / "bench" / "sim_engine.py"


@contextmanager
def sim_engine(*args: str) -> Iterator[str]:
    """``bench/sim_engine.py`` with ``args`` on a port it picks and prints; yields its base URL and
    stops it by its pid (SIGTERM, then SIGKILL after 10 s)."""
    proc = subprocess.Popen([sys.executable, str(SIM_ENGINE), "--port", "0", *args],
                            stdout=subprocess.PIPE, text=True)
    _STARTED[proc.pid] = proc.kill  # unreaped until the wait below: the pid is still this child
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # bounded by the test's timeout; the server prints at once
        assert line.startswith("listening on "), line
        yield "http://" + line.split("listening on ", 1)[1].strip()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        finally:
            _STARTED.pop(proc.pid, None)


def stop_started_on_sigterm() -> None:
    """From the main thread: on SIGTERM, stop what the tests started and not yet stopped (each by
    its recorded group or pid), then die of the SIGTERM as before. Only where no one else handles
    SIGTERM. Not a KeyboardInterrupt: raised inside pytest-asyncio's loop, that hung the run."""
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def stop_all(signum: int, frame: object) -> None:
        for stop in list(_STARTED.values()):  # one C call under the GIL: no lock a thread may hold
            try:
                stop()
            except Exception:  # one that fails must not keep the rest running
                pass
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, stop_all)
