"""The watcher of a detached server: ``python -m harvest.server.watch RUN_DIR``.

``harvest serve --detach`` returns once the server is ready; this small process, started in its
own session, keeps adding the server's descendants (pid + create time) to the state file every
few seconds, so a later ``harvest stop`` can find reparented workers. It exits by itself when the
recorded status becomes stopping/stopped/failed or when no recorded process is alive any more.

It never signals any process; it only records.
"""

from __future__ import annotations

import argparse
import sys
import time

from harvest.errors import StopError
from harvest.server import procs
from harvest.server.state import RunStatus, StateFile

DONE = (RunStatus.STOPPING, RunStatus.STOPPED, RunStatus.DIRTY, RunStatus.FAILED)


def watch(run_dir: str, interval: float = 2.0) -> int:
    """Record descendants until the server is gone or being stopped. Returns an exit code."""
    sf = StateFile(run_dir)
    while True:
        try:
            state = sf.read()
        except StopError as exc:
            print(f"watcher: {exc}", file=sys.stderr)
            return 1
        if state.status in DONE or not procs.alive(state.processes()):
            return 0
        sf.add_descendants(procs.discover(state),
                           keep=lambda ref: procs.verified(ref, include_zombies=True) is not None)
        time.sleep(interval)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harvest.server.watch", description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--interval", type=float, default=2.0)
    args = ap.parse_args(argv)
    return watch(args.run_dir, args.interval)


if __name__ == "__main__":
    sys.exit(main())
