"""A stand-in for a container exec prefix (``docker exec CTR ...``) in front of an engine's argv.

    python exec_prefix.py --pid-dir D [--life S] -- ENGINE ARGV...

Like a container runtime, it does not run the engine as its own child: the engine is started
double-forked in a session of its own (as if by the container's daemon), so it is neither a
descendant nor a member of the prefix's process group or session. The prefix itself then waits and
stays attached while the engine runs and never returns before it exits: it ignores SIGTERM (only
SIGKILL ends it). It ends by itself when the engine exits or --life seconds pass.

Writes ``D/engine.pid`` (the engine's pid, written by the engine's process before it execs) and
``D/prefix.pid``. It must not import harvest.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time


def main() -> int:
    argv = sys.argv[1:]
    if "--" not in argv:
        print("usage: exec_prefix.py --pid-dir D [--life S] -- ENGINE ARGV...", file=sys.stderr)
        return 2
    cut = argv.index("--")
    ap = argparse.ArgumentParser()
    ap.add_argument("--pid-dir", required=True)
    ap.add_argument("--life", type=float, default=120.0)
    args = ap.parse_args(argv[:cut])
    engine = argv[cut + 1:]

    with open(os.path.join(args.pid_dir, "prefix.pid"), "w") as fh:
        fh.write(str(os.getpid()))
    path = os.path.join(args.pid_dir, "engine.pid")
    if os.path.exists(path):
        os.unlink(path)  # left by an earlier invocation (e.g. the launcher's `--version` probe)
    if os.fork() == 0:
        os.setsid()  # out of the prefix's group and session, like a process the daemon starts
        if os.fork() == 0:
            with open(path + ".tmp", "w") as fh:
                fh.write(str(os.getpid()))
            os.replace(path + ".tmp", path)
            os.execv(engine[0], engine)
        os._exit(0)
    os.wait()  # the intermediate exits at once; the engine is reparented away from us
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"exec-prefix: pid {os.getpid()} attached to the engine, waiting", flush=True)
    end = time.monotonic() + args.life
    while time.monotonic() < end and not os.path.exists(path):
        time.sleep(0.01)
    engine_pid = int(open(path).read()) if os.path.exists(path) else None
    while time.monotonic() < end and engine_pid is not None and _running(engine_pid):
        time.sleep(0.2)
    return 0


def _running(pid: int) -> bool:
    """Whether ``pid`` is still running (a zombie waiting for its new parent counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
