"""Helpers every benchmark script shares (imported as ``benchutil``: a script's folder is on sys.path)."""

from __future__ import annotations

import os
import signal
import subprocess


def load() -> str:
    """The 1, 5 and 15 minute load averages, printed beside every figure."""
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def exit_on_sigterm() -> None:
    """SIGTERM (and SIGINT, which a shell may leave ignored in background jobs) raise SystemExit,
    so the ``finally`` blocks stop what the script started."""
    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)


def stop(proc: subprocess.Popen[str], grace: float = 5.0) -> None:
    """SIGTERM the process we started, then SIGKILL it if it outlives ``grace``."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=grace)
