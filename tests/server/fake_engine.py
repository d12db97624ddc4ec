"""A stand-in engine server for the supervisor tests, run by path as a ``command`` engine.

It serves ``GET /health`` and ``GET /v1/models`` (which needs ``Bearer KEY`` when --key-echo KEY
is given) on --host/--port, and misbehaves on request, the way real engines do:

    --trap-term            the server itself ignores SIGTERM
    --child-ignores-term   fork a worker ("child") that ignores SIGTERM
    --double-fork          fork two workers through short-lived intermediates, so they are
                           reparented: "w1" stays in the process group; "w2" waits until it is
                           reparented, then calls setsid() and so leaves the group and the session
    --crash                fork a worker ("crash-child"), print a message, raise (traceback)
    --escape-with-port     once listening, double-fork a worker ("escaped") that calls setsid() at
                           once (before anyone can record it) and keeps the listening socket open
    --ready-after S        /health answers 503 for S seconds first

Each worker writes ``PID_DIR/<role>.pid`` (and w2 ``w2.setsid`` once it left the group). Every
process here ends by itself after --life seconds, so a failing test leaves nothing for long. It
must not import harvest.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import signal
import sys
import time

args = None


def _write(name: str, text: str) -> None:
    path = os.path.join(args.pid_dir, name)
    with open(path + ".tmp", "w") as fh:
        fh.write(text)
    os.replace(path + ".tmp", path)


def _sleep_until_life_ends() -> None:
    end = time.monotonic() + args.life
    while time.monotonic() < end:
        time.sleep(0.2)


def worker(role: str, *, ignore_term: bool = False) -> None:
    """In a forked child: become a worker that lives until --life ends (or a signal)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore_term else signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _write(f"{role}.pid", str(os.getpid()))
    _sleep_until_life_ends()
    os._exit(0)


def fork_worker(role: str, *, ignore_term: bool = False) -> None:
    if os.fork() == 0:
        worker(role, ignore_term=ignore_term)


def double_fork(role: str, *, intermediate_life: float, leave_group: bool) -> None:
    if os.fork() != 0:
        return  # the server goes on; SIGCHLD is ignored, so the intermediate is reaped
    # intermediate
    parent = os.getpid()
    if os.fork() == 0:
        if leave_group:
            deadline = time.monotonic() + args.life
            while os.getppid() == parent and time.monotonic() < deadline:
                time.sleep(0.05)
            os.setsid()
            _write(f"{role}.setsid", str(os.getpid()))
        worker(role)
    time.sleep(intermediate_life)
    os._exit(0)


class Handler(http.server.BaseHTTPRequestHandler):
    started = time.monotonic()

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/health":
            ok = time.monotonic() - self.started >= args.ready_after
            body = json.dumps({"status": "ok" if ok else "loading"}).encode()
            self.send_response(200 if ok else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/v1/models":
            if args.key_echo and self.headers.get("Authorization") != f"Bearer {args.key_echo}":
                self.send_error(401)
                return
            body = json.dumps({"object": "list", "data": [{"id": "fake", "object": "model"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_error(404)

    def log_message(self, fmt: str, *a: object) -> None:
        pass


def main() -> int:
    global args
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pid-dir", required=True)
    ap.add_argument("--trap-term", action="store_true")
    ap.add_argument("--child-ignores-term", action="store_true")
    ap.add_argument("--double-fork", action="store_true")
    ap.add_argument("--intermediate-life", type=float, default=3.0)
    ap.add_argument("--crash", action="store_true")
    ap.add_argument("--escape-with-port", action="store_true")
    ap.add_argument("--ready-after", type=float, default=0.0)
    ap.add_argument("--life", type=float, default=120.0)
    ap.add_argument("--key-echo", default=None, help="an engine's --api-key: /v1/models then needs it")
    args = ap.parse_args()

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    _write("server.pid", str(os.getpid()))
    print(f"fake-engine: pid {os.getpid()} pgid {os.getpgid(0)} starting on {args.host}:{args.port}", flush=True)
    if args.crash:
        fork_worker("crash-child")
        time.sleep(0.3)
        print("fake-engine: cannot load weights (no such file: model.safetensors)", flush=True)
        raise RuntimeError("fake-engine: start-up failed on purpose")
    if args.child_ignores_term:
        fork_worker("child", ignore_term=True)
    if args.double_fork:
        double_fork("w1", intermediate_life=0.0, leave_group=False)
        double_fork("w2", intermediate_life=args.intermediate_life, leave_group=True)
    if args.trap_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    server = http.server.ThreadingHTTPServer((args.host, args.port), Handler)
    server.timeout = 0.5
    if args.escape_with_port and os.fork() == 0:
        if os.fork() == 0:  # reparented at once, out of the group and the session
            os.setsid()
            worker("escaped")
        os._exit(0)
    print("fake-engine: listening", flush=True)
    end = time.monotonic() + args.life
    while time.monotonic() < end:
        server.handle_request()
    return 0


if __name__ == "__main__":
    sys.exit(main())
