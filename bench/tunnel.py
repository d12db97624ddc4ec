"""P1 through the tunnel: generation tok/s through harvest's SSH port forward vs direct, same server.

    python bench/tunnel.py [--prompts 96] [--max-tokens 64] [--concurrency 8] [--rounds 3]

Starts one vLLM CPU server (the tiny random model, bound to 127.0.0.1) and one OpenSSH server on
a loopback port (own host key and user key, as the tests do; needs root and openssh-server), then
opens harvest's :class:`~harvest.placement.ssh.tunnel.Tunnel` (OpenSSH's client, ``ssh -N -L``) to the
server's port and, when ``asyncssh`` is importable, an asyncssh local forward to the same port.

Each round drives the same prompts with harvest's own :class:`~harvest.client.Client` through the
direct URL and through each tunnel. ``--mode alternate``: each path alone at the full
concurrency, the order rotating every round, so the server is saturated as in a campaign and the
tunnel's added latency per request is hidden behind the engine's queue only if it really is small.
``--mode head-to-head`` (default, the recorded figure): all paths at the same time, the concurrency split evenly; a path with more
latency per request then also loses server share to the others, so this ratio is a lower bound
(on a shared 2-core machine it is steadier against load that comes and goes). Every request generates exactly
``max_tokens`` (``ignore_eos``). tok/s of a path = its completion tokens / its own window (its first
request sent to its last answer). The figure is the median over rounds of tunnel tok/s / direct
tok/s; the load average is printed beside each round, and so are each path's connections (open at
the end of its window / closed during it: keep-alive holds when the second stays near 0, while a
path that opened a connection per request would close about one per request).

``--engine sim`` serves from ``bench/sim_engine.py`` instead (a continuous-batching engine that
sleeps a decode step per batch: its compute is not on this machine's cores, as on a GPU box). On a
2-core machine vLLM CPU keeps both cores busy, so the tunnel's two extra processes (``ssh``, ``sshd``)
take CPU from the engine itself; with the sim engine the ratio is the tunnel's own cost per request.

Everything started here is stopped here: the server by its process group, sshd by its pid, the
tunnels by closing them.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import benchutil  # noqa: E402

from harvest.client import Client  # noqa: E402
from harvest.config import ClientConfig, HostConfig, SamplingConfig  # noqa: E402
from harvest.placement.ssh.tunnel import Tunnel  # noqa: E402
from tests import engines  # noqa: E402
from tests.hosts.conftest import start_sshd  # noqa: E402


def connections(port: int) -> tuple[int, set[tuple]]:
    """TCP connections to or from ``port`` now: (established count, the TIME_WAIT ones by address
    pair). A client that lost keep-alive closes one connection per request, which leaves a
    TIME_WAIT behind each (60 s); those that appear during a window are the ones it closed (a
    count difference would go negative as older ones expire)."""
    est = 0
    waiting: set[tuple] = set()
    for c in psutil.net_connections(kind="tcp"):
        if (c.laddr and c.laddr.port == port) or (c.raddr and c.raddr.port == port):
            est += c.status == psutil.CONN_ESTABLISHED
            if c.status == psutil.CONN_TIME_WAIT:
                waiting.add((tuple(c.laddr), tuple(c.raddr) if c.raddr else ()))
    return est, waiting


async def drive(url: str, n: int, concurrency: int, max_tokens: int, tag: str) -> tuple[int, float, int, int]:
    """(completion tokens, window seconds, connections open at the end, connections closed during it)."""
    sampling = SamplingConfig(max_tokens=max_tokens, temperature=0.0, extra_body={"ignore_eos": True})
    tokens = 0
    port = int(url.rsplit(":", 1)[1])
    async with Client([url], ClientConfig(concurrency=concurrency, max_retries=0), sampling) as client:
        await client.chat([{"role": "user", "content": "warm up"}], max_tokens=1)
        closed_before = connections(port)[1]
        t0 = time.monotonic()

        async def one(i: int) -> None:
            nonlocal tokens
            c = await client.chat([{"role": "user", "content": f"{tag} prompt {i}: tell me a story."}])
            tokens += c.completion_tokens or 0

        await asyncio.gather(*(one(i) for i in range(n)))
        window = time.monotonic() - t0
        est, closed = connections(port)
        return tokens, window, est, len(closed - closed_before)


class AsyncsshForward:
    """An asyncssh local port forward (for the comparison only; harvest uses OpenSSH's client)."""

    def __init__(self, port: int, key: Path, known: Path, far_port: int):
        self.port, self.key, self.known, self.far_port = port, key, known, far_port

    async def open(self) -> str:
        import asyncssh

        self.conn = await asyncssh.connect("127.0.0.1", port=self.port, username="root", client_keys=[str(self.key)],
                                           known_hosts=str(self.known))
        self.listener = await self.conn.forward_local_port("127.0.0.1", 0, "127.0.0.1", self.far_port)
        return f"http://127.0.0.1:{self.listener.get_port()}"

    async def close(self) -> None:
        self.listener.close()
        self.conn.close()
        await self.conn.wait_closed()


async def main_async(args: argparse.Namespace, server_url: str, far_port: int, sshd) -> None:
    host = HostConfig.model_validate({"ssh": "root@127.0.0.1", "port": sshd.port, "identity_file": str(sshd.key),
                                      "ssh_options": [f"UserKnownHostsFile={sshd.known_hosts}"]})
    tunnel = Tunnel(host, far_port)
    tunnel.open()
    paths = {"direct": server_url, "openssh": tunnel.url}
    fwd = None
    try:
        import asyncssh  # noqa: F401

        fwd = AsyncsshForward(sshd.port, sshd.key, sshd.known_hosts, far_port)
        paths["asyncssh"] = await fwd.open()
    except ImportError:
        print("asyncssh not installed: OpenSSH only")
    ratios: dict[str, list[float]] = {k: [] for k in paths if k != "direct"}
    try:
        per = max(1, args.concurrency // len(paths))
        names = list(paths)
        for r in range(args.rounds):
            if args.mode == "head-to-head":
                got = dict(zip(paths, await asyncio.gather(*(drive(url, args.prompts, per, args.max_tokens, name)
                                                             for name, url in paths.items()))))
            else:  # each path alone at the full concurrency, the order rotating every round
                order = names[r % len(names):] + names[:r % len(names)]
                got = {name: await drive(paths[name], args.prompts, args.concurrency, args.max_tokens, name)
                       for name in order}
            rates = {name: tok / win for name, (tok, win, _, _) in got.items()}
            line = ", ".join(f"{k} {v:.1f} tok/s" for k, v in rates.items())
            line += "; connections open/closed: " + ", ".join(f"{k} {o}/{c}" for k, (_, _, o, c) in got.items())
            for k in ratios:
                ratios[k].append(rates[k] / rates["direct"])
            print(f"round {r + 1}: {line}; " + ", ".join(f"{k}/direct x{ratios[k][-1]:.3f}" for k in ratios)
                  + f"; {benchutil.load()}", flush=True)
    finally:
        if fwd is not None:
            await fwd.close()
        tunnel.close()
    for k, v in ratios.items():
        print(f"P1 tunnel ({k}) / direct: median x{statistics.median(v):.3f} over {len(v)} rounds "
              f"({', '.join(f'{x:.3f}' for x in v)})")
    print("BENCH p1-tunnel " + " ".join(f"{k}=x{statistics.median(v):.3f}" for k, v in ratios.items()))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=96)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=12)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--mode", choices=["alternate", "head-to-head"], default="head-to-head",
                   help="alternate: each path alone at --concurrency, order rotating (a saturated server, "
                        "as in a campaign); head-to-head: all paths at once, the concurrency split")
    p.add_argument("--engine", choices=["vllm", "sim"], default="vllm",
                   help="vllm: vLLM CPU and the tiny model (the recorded figure); sim: bench/sim_engine.py, "
                        "a decode step of --sim-step s per batch of up to --sim-batch, no CPU of its own")
    p.add_argument("--sim-step", type=float, default=0.02)
    p.add_argument("--sim-batch", type=int, default=64)
    args = p.parse_args()
    benchutil.exit_on_sigterm()
    work = Path(tempfile.mkdtemp(prefix="harvest-bench-tunnel-"))
    port = engines.free_port()
    if args.engine == "sim":
        argv = [sys.executable, str(Path(__file__).with_name("sim_engine.py")), "--port", str(port),
                "--token-latency", str(args.sim_step), "--max-batch", str(args.sim_batch)]
        server = engines.start_engine(argv, port=port, model="sim-model", log_path=work / "server.log",
                                      health="/health", timeout=60)
    else:
        py = engines.install_engine("vllm") if "HARVEST_VLLM_PYTHON" not in __import__("os").environ \
            else __import__("os").environ["HARVEST_VLLM_PYTHON"]
        model = engines.build_tiny_model(py, work / "model", gguf=False)
        server = engines.start_engine(engines.vllm_argv(py, str(model), port, "--max-model-len", "2048"), port=port,
                                      model=str(model), log_path=work / "server.log", health="/health",
                                      env=engines.VLLM_ENV, timeout=600)
    print(f"engine: {args.engine}" + (f" (step {args.sim_step} s, batch {args.sim_batch})" if args.engine == "sim"
                                      else ""), flush=True)
    sshd = None
    try:
        sshd = start_sshd(work / "sshd")
        asyncio.run(main_async(args, server.url, port, sshd))
    finally:
        if sshd is not None:
            sshd.stop()
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
