"""A `command` engine whose process tree fights its stop (a real process tree; only the model is missing).

    python stubborn_engine.py --port P --pid-dir D [--spawn-on-term] [--worker]

Serves GET /health (200) on 127.0.0.1:P. ``--worker``: one worker child in the leader's group,
its pid in D/worker.pid. ``--spawn-on-term``: the leader ignores SIGTERM and answers each one by
forking a new worker that leaves the group (setsid), ignores SIGTERM too and writes its pid to
D/late-N.pid: workers that appear during the stop's grace, outside the group it signals.
"""

from __future__ import annotations

import argparse
import http.server
import os
import signal
import time
from pathlib import Path


def sleep_forever() -> None:
    while True:
        time.sleep(3600)


def fork_worker(pid_file: Path, *, leave_group: bool) -> None:
    if os.fork() == 0:
        try:
            if leave_group:
                os.setsid()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            tmp = pid_file.with_suffix(".tmp")
            tmp.write_text(str(os.getpid()))
            tmp.rename(pid_file)
            sleep_forever()
        finally:
            os._exit(0)


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, fmt: str, *a: object) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pid-dir", type=Path, required=True)
    ap.add_argument("--spawn-on-term", action="store_true")
    ap.add_argument("--worker", action="store_true")
    args = ap.parse_args()
    args.pid_dir.mkdir(parents=True, exist_ok=True)
    (args.pid_dir / "leader.pid").write_text(str(os.getpid()))
    if args.worker:
        fork_worker(args.pid_dir / "worker.pid", leave_group=False)
    if args.spawn_on_term:
        count = iter(range(1, 1000))
        signal.signal(signal.SIGTERM, lambda *_: fork_worker(args.pid_dir / f"late-{next(count)}.pid",
                                                             leave_group=True))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Health)
    server.serve_forever()


if __name__ == "__main__":
    main()
