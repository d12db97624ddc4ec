"""P4 stop latency: SIGTERM -> verified clean with harvest, against SIGTERM -> exit of the same server.

    python bench/stop_latency.py [--rounds 3]                               # vLLM CPU, tiny model
    python bench/stop_latency.py --engine transformers --model DIR --gpu 0  # GPU machine

Each round launches the same engine server twice, with the argv and environment of harvest's engine
adapter, and stops it after a few requests (alternating, raw first):

    raw       launched by hand (``Popen``, own session), then SIGTERM to its process group; timed
              until the leader has exited and until no process of the group is left (polled every
              10 ms), plus, for information, until the port can be bound again and (GPU) until
              the GPU's used memory is back within 256 MiB of its pre-launch value
    harvest   launched by harvest's ``Server``; ``Server.shutdown()`` timed from the call to the
              returned StopReport: record -> SIGTERM -> grace -> (GPU memory back to baseline) ->
              port bindable; its steps are printed. The same stop also gives a paired baseline,
              free of the launch-to-launch variation of the engine's exit (0.3 to 1.4 s here): the
              moment harvest sends SIGTERM (its ``os.killpg``, noted in this process) and the
              moments the engine's processes have exited (pidfds, whoever reaps them)

Target: harvest's verified stop <= the engine's own exit (group gone) + 0.5 s, medians over rounds,
against the raw rounds and against the paired baseline.
Every figure carries the load average. Only processes this script started are signalled: the raw
server through the process group recorded at its launch, harvest's through its launch record.
"""

from __future__ import annotations

import argparse
import os
import platform
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from benchutil import exit_on_sigterm, load  # bench/benchutil.py

ROOT = Path(__file__).resolve().parent.parent
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
#: How often the raw baseline looks whether the engine has exited.
RAW_POLL = 0.01
MARGIN_MIB = 256



def free_port() -> int:
    """A port free a moment ago; the launch retries when it was taken meanwhile."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_config(args: argparse.Namespace, py: str, model: str, port: int):
    from harvest.config import ServerConfig

    if args.engine == "vllm":
        return ServerConfig(engine="vllm", model=model, python=py, port=port, served_model_name="tiny",
                            env=dict(VLLM_ENV), extra_args=["--max-model-len", "2048"], ready_timeout=600.0,
                            stop_grace=args.grace, stop_deadline=args.deadline)
    # Without a GPU the adapter asks for "--device auto", which needs accelerate: name the CPU
    # (the last --device wins).
    extra = [] if args.gpu is not None else ["--device", "cpu"]
    return ServerConfig(engine="transformers", model=model, python=py, port=port, extra_args=extra,
                        gpus=[args.gpu] if args.gpu is not None else [], dtype=args.dtype,
                        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}, ready_timeout=900.0,
                        stop_grace=args.grace, stop_deadline=args.deadline)


def exercise(url: str, model: str | None, n: int = 4) -> None:
    """A few short chat requests, so the server is stopped after real work, not idle from boot."""
    body = {"messages": [{"role": "user", "content": "Say something."}], "max_tokens": 8, "temperature": 0.0}
    if model:
        body["model"] = model
    from harvest.http import SyncHttp

    with SyncHttp(max_connections=1) as client:
        for _ in range(n):
            r = client.post(url + "/v1/chat/completions", json=body, timeout=120.0)
            if not r.ok:
                raise RuntimeError(f"POST {url}/v1/chat/completions answered HTTP {r.status}: {r.text[:200]}")


# ----------------------------------------------------------------------------------------- raw

def _group_members(pgid: int) -> list[psutil.Process]:
    """Processes of the group that are not zombies."""
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (OSError, psutil.Error):
            continue
    return out


def _wait_ready(url: str, paths: list[str], proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    from harvest.http import HttpError, SyncHttp

    with SyncHttp(max_connections=1) as client:
        for path in paths:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"the raw server exited with {proc.returncode} before it was ready")
                try:
                    if client.get(url + path, timeout=5.0).status == 200:
                        break
                except HttpError:
                    pass
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"the raw server was not ready within {timeout:.0f} s")
                time.sleep(0.5)


def raw_round(args: argparse.Namespace, py: str, model: str, work: Path, tag: str, probe) -> dict[str, float]:
    from harvest.net import port_bindable
    from harvest.server import adapter_for

    for attempt in range(3):
        cfg = server_config(args, py, model, free_port())
        adapter = adapter_for(cfg.engine)
        argv = adapter.argv(cfg)
        env = {**os.environ, **adapter.environment(cfg), **cfg.env}
        gpus = list(cfg.gpus)
        baseline = probe.memory_used(gpus) if gpus else {}
        log_path = work / f"raw-{tag}-{attempt}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        pgid = proc.pid  # start_new_session: the leader's pid is the group id
        try:
            try:
                _wait_ready(cfg.url, [c.path for c in adapter.readiness(cfg)], proc, cfg.ready_timeout)
            except RuntimeError:
                if "address already in use" in log_path.read_text(errors="replace").lower():
                    continue
                raise RuntimeError(f"raw launch failed; log tail:\n{log_path.read_text(errors='replace')[-3000:]}")
            exercise(cfg.url, cfg.served_model_name)
            load_before = load()
            t0 = time.monotonic()
            os.killpg(pgid, signal.SIGTERM)
            leader = group = port = memory = None
            until = t0 + args.deadline
            while time.monotonic() < until:
                now = time.monotonic()
                if leader is None and proc.poll() is not None:
                    leader = now - t0
                if leader is not None and group is None and not _group_members(pgid):
                    group = time.monotonic() - t0
                if port is None and port_bindable(cfg.host, cfg.port):
                    port = time.monotonic() - t0
                if memory is None and gpus:
                    used = probe.memory_used(gpus)
                    if all(used[g] <= baseline.get(g, 0) + MARGIN_MIB for g in gpus):
                        memory = time.monotonic() - t0
                elif not gpus:
                    memory = 0.0
                if leader is not None and group is not None and port is not None and memory is not None:
                    break
                time.sleep(RAW_POLL)
            if group is None:
                raise RuntimeError(f"the raw server did not exit within {args.deadline:g} s of SIGTERM")
            return {"exit_s": leader, "group_s": group, "port_s": port if port is not None else float("nan"),
                    "memory_s": memory if gpus and memory is not None else float("nan"),
                    "load_before": load_before, "load_after": load()}
        finally:
            # Whatever happened above: nothing of this group outlives the round.
            if proc.poll() is None or _group_members(pgid):
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
    raise RuntimeError("the raw server's port was taken three times in a row")


# ----------------------------------------------------------------------------------------- harvest

class ExitWatch:
    """A thread noting, during harvest's stop, when the engine itself had exited: each process of
    its group (seen at the start) watched through a pidfd, which becomes readable the moment that
    process has exited, whoever reaps it. The engine's own exit inside the very stop harvest times."""

    def __init__(self, leader: int, members: list[int]):
        self.leader = leader
        self.t0 = 0.0
        self.exit_s: float | None = None
        self.group_s: float | None = None
        self._fds: dict[int, int] = {}
        for pid in {leader, *members}:
            try:
                self._fds[os.pidfd_open(pid)] = pid
            except ProcessLookupError:
                continue
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, t0: float) -> None:
        self.t0 = t0
        self._thread.start()

    def _run(self) -> None:
        poller = select.poll()
        for fd in (*self._fds, self._wake_r):
            poller.register(fd, select.POLLIN)
        left = set(self._fds)
        while left:
            events = poller.poll(10_000)
            now = time.monotonic() - self.t0
            for fd, _ in events:
                if fd == self._wake_r:
                    return
                if fd in left:
                    left.discard(fd)
                    poller.unregister(fd)
                    if self._fds[fd] == self.leader:
                        self.exit_s = now
            if not left:
                self.group_s = now

    def stop(self) -> None:
        self._thread.join(1.0)  # let it see the last process go, if it has not yet
        os.write(self._wake_w, b"x")
        self._thread.join(5.0)
        for fd in (*self._fds, self._wake_r, self._wake_w):
            os.close(fd)


def harvest_round(args: argparse.Namespace, py: str, model: str, work: Path, tag: str) -> dict[str, object]:
    from harvest.config import PreflightConfig
    from harvest.errors import LaunchError, PreflightFailed
    from harvest.server import Server

    preflight = PreflightConfig(min_disk_free_gib=1, ram_reserve_gib=1)
    for attempt in range(3):
        cfg = server_config(args, py, model, free_port())
        server = Server(cfg, run_dir=work / f"harvest-{tag}-{attempt}", preflight=preflight, force=args.force)
        try:
            server.launch()
        except (LaunchError, PreflightFailed) as exc:
            if isinstance(exc, PreflightFailed) or "address already in use" in str(exc).lower():
                continue
            raise
        try:
            exercise(cfg.url, cfg.served_model_name)
            assert server.pid is not None
            watch = ExitWatch(server.pid, [p.pid for p in _group_members(server.pid)])
            # Note when harvest sends its SIGTERM (harvest signals the group with os.killpg, in
            # this process): the engine's own SIGTERM -> exit inside this stop starts there.
            sent: list[float] = []
            real_killpg = os.killpg

            def spy(pgid: int, sig: int, sent: list[float] = sent, real_killpg=real_killpg) -> None:
                if sig == signal.SIGTERM and not sent:
                    sent.append(time.monotonic())
                real_killpg(pgid, sig)

            load_before = load()
            os.killpg = spy
            try:
                t0 = time.monotonic()
                watch.start(t0)
                report = server.shutdown()
                wall = time.monotonic() - t0
            finally:
                os.killpg = real_killpg
            watch.stop()
        finally:
            server.shutdown()  # idempotent: a no-op after the timed call
        assert report is not None
        return {"stop_s": wall, "report": report, "engine_exit_s": watch.exit_s, "engine_group_s": watch.group_s,
                "sigterm_s": sent[0] - t0 if sent else None, "load_before": load_before, "load_after": load()}
    raise RuntimeError("harvest's launch failed three times (port taken or preflight)")


# ----------------------------------------------------------------------------------------- main

def engine_python(args: argparse.Namespace) -> str:
    if args.engine_python:
        return args.engine_python
    if args.engine == "transformers":
        return sys.executable
    done = subprocess.run([str(ROOT / "scripts" / "install-engines"), "vllm"], check=False, capture_output=True,
                          text=True,
                          timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"scripts/install-engines vllm failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]



def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f} s"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=["vllm", "transformers"], default="vllm")
    ap.add_argument("--model", help="model folder (vllm default: harvest's tiny model, built when missing)")
    ap.add_argument("--engine-python", help="Python that runs the engine (vllm default: scripts/install-engines "
                                            "vllm; transformers default: this Python)")
    ap.add_argument("--gpu", type=int, help="GPU index for the engine (transformers)")
    ap.add_argument("--dtype", default=None, help="engine dtype (transformers on a GPU: bfloat16)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--grace", type=float, default=20.0, help="harvest's SIGTERM grace before SIGKILL")
    ap.add_argument("--deadline", type=float, default=60.0, help="longest one stop may take")
    ap.add_argument("--force", action="store_true", help="launch even if harvest's preflight fails")
    ap.add_argument("--keep", type=Path, help="keep server logs and run folders in this folder")
    args = ap.parse_args(argv)
    if args.engine == "transformers" and not args.model:
        ap.error("--engine transformers needs --model DIR")

    exit_on_sigterm()
    py = engine_python(args)
    if args.model:
        model = str(Path(args.model).resolve())
    else:
        from harvest.campaign.demo import ensure_tiny_model

        model = str(ensure_tiny_model(py))
    work = args.keep or Path(tempfile.mkdtemp(prefix="harvest-p4-"))
    work.mkdir(parents=True, exist_ok=True)

    from harvest.gpu import open_probe

    probe = open_probe()
    print(f"P4 stop latency: {args.engine} ({Path(model).name}), {args.rounds} rounds, raw and harvest alternating",
          flush=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"GPUs: {len(probe.snapshot().gpus)}, {time.strftime('%Y-%m-%d %H:%M')}; {load()}", flush=True)
    raw: list[dict[str, float]] = []
    ours: list[dict[str, object]] = []
    try:
        for k in range(args.rounds):
            r = raw_round(args, py, model, work, str(k), probe)
            raw.append(r)
            print(f"  round {k} raw      exit {r['exit_s']:.3f} s, group gone {r['group_s']:.3f} s, port free "
                  f"{r['port_s']:.3f} s, GPU memory back {r['memory_s']:.3f} s  ({r['load_before']} -> "
                  f"{r['load_after']})", flush=True)
            h = harvest_round(args, py, model, work, str(k))
            ours.append(h)
            report = h["report"]
            steps = ", ".join(f"{s.name} {s.duration_s:.3f}" for s in report.steps)
            print(f"  round {k} harvest  verified {report.verdict} in {h['stop_s']:.3f} s (SIGTERM sent at "
                  f"{_s(h['sigterm_s'])}; the engine itself: exit {_s(h['engine_exit_s'])}, group gone "
                  f"{_s(h['engine_group_s'])}; report total {report.total_s:.3f} s; {steps}; escalated "
                  f"{report.escalated})  ({h['load_before']} -> {h['load_after']})", flush=True)
    finally:
        probe.close()

    group = statistics.median(r["group_s"] for r in raw)
    exit_ = statistics.median(r["exit_s"] for r in raw)
    stop = statistics.median(float(h["stop_s"]) for h in ours)  # type: ignore[arg-type]
    clean = all(h["report"].clean for h in ours)  # type: ignore[union-attr]
    print(f"\nmedians: raw SIGTERM -> leader exit {exit_:.3f} s, -> group gone {group:.3f} s; "
          f"harvest SIGTERM -> verified clean {stop:.3f} s ({'all clean' if clean else 'NOT ALL CLEAN'})")
    # Paired: harvest's whole stop against the engine's own SIGTERM -> group gone in that same stop.
    paired = [float(h["stop_s"]) - (h["engine_group_s"] - h["sigterm_s"])  # type: ignore[operator]
              for h in ours if h["engine_group_s"] is not None and h["sigterm_s"] is not None]
    if paired:
        print(f"paired (within harvest's own stops): harvest's call -> verdict minus the engine's SIGTERM -> "
              f"group gone, median {statistics.median(paired):+.3f} s (rounds: "
              f"{', '.join(f'{x:+.3f}' for x in paired)})"
              f"  (target <= +0.5 s: {'met' if statistics.median(paired) <= 0.5 else 'MISSED'})")
    over = stop - group
    print(f"harvest - engine exit = {over:+.3f} s  (target <= +0.5 s: {'met' if over <= 0.5 else 'MISSED'}); "
          f"ratio x{stop / group:.2f}; {load()}")
    print(f"BENCH p4_stop engine={args.engine} raw_exit_s={group:.3f} harvest_clean_s={stop:.3f} "
          f"over_s={over:.3f} paired_over_s={statistics.median(paired) if paired else float('nan'):.3f} "
          f"clean={clean} load1={os.getloadavg()[0]:.2f}")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
