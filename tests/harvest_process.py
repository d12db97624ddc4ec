"""``harvest`` commands for the tests, as processes forked from one interpreter that imported harvest.

A test that runs ``python -m harvest ...`` (or the ``harvest`` script) pays the interpreter and the
imports every time: 0.4-0.5 s of CPU for ``stop``/``status``/``serve`` and about 1 s for ``run`` on
a 2-core VM, most of the fast tier's CPU. Here each pytest worker starts one *fork host* (a plain
``python`` of the same interpreter and environment, single-threaded, that imports every command's
module and waits). Each command is a ``fork()`` of it: its own pid, argv, environment, working
directory, stdin/stdout/stderr and exit status, then ``harvest``'s own ``__main__`` as
``python -m harvest`` (or the script) runs it, and the interpreter's own exit (non-daemon threads
joined, ``atexit``, the streams flushed). What it skips is the interpreter start and the imports,
which the README commands' and the demo's tests still run in full.

:func:`run` takes ``subprocess.run``'s arguments and :class:`Popen` ``subprocess.Popen``'s (the
parts the tests use). Anything the fork cannot reproduce goes to a fresh interpreter instead, by
the same call: another interpreter or interpreter options (``-X dev``), an environment whose
``PYTHON*``, ``LC_*`` or ``LANG`` differ from the host's (they act at interpreter start),
``HARVEST_TEST_FRESH_PROCESSES=1`` (every command fresh, for a check of the start-up itself), or a
host that could not start (said once on stderr).

The host is the worker's child; each command is the host's child, reaped by it only once its
caller has its exit status: until then its pid (and its group, with ``start_new_session``) cannot
be another process's, as for a child of the caller's own, so a test signals ``proc.pid`` as it
would a ``subprocess.Popen``'s. A caller that goes with its command still running (an exception,
a forgotten ``Popen`` at the worker's end) has it killed, as ``subprocess.run`` kills its child on
an exception; the worker's end closes the host's control socket and the host ends, killing what it
still runs.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import locale
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: The modules the host imports: every command's (harvest.cli.main's table) and what ``run``
#: imports while it runs.
_PRELOAD_EXTRA = ("harvest.campaign.run.session", "harvest.report.run", "harvest.campaign.outputs.export")

#: Environment variables that act at interpreter start (the fork cannot apply them again).
_START_PREFIXES = ("PYTHON", "LC_")
_START_NAMES = ("LANG",)
_FRESH_ENV = "HARVEST_TEST_FRESH_PROCESSES"
_ROOT = str(Path(__file__).resolve().parents[1])
_MSG = 1 << 20  # the largest message (an environment) one SOCK_SEQPACKET record holds here


def _start_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_START_PREFIXES) or k in _START_NAMES}


def _harvest_script() -> str:
    return str(Path(sys.executable).with_name("harvest"))


def _how(argv: Sequence[Any]) -> tuple[str, list[str]] | None:
    """``("module", args)`` for ``[sys.executable, "-m", "harvest"|"harvest.cli.main", *args]``,
    ``("script", args)`` for ``[<this interpreter's harvest script>, *args]``; None otherwise."""
    argv = [os.fspath(a) for a in argv]
    if len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m" and argv[2] in ("harvest", "harvest.cli.main"):
        return argv[2], argv[3:]
    if argv and argv[0] == _harvest_script():
        return "script", argv[1:]
    return None


# --- the host ------------------------------------------------------------------------------------


def _exit_code(exc: SystemExit) -> int:
    """The exit status the interpreter gives a SystemExit (its message printed as it would)."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _streams() -> None:
    """sys.stdin/stdout/stderr on the new fds 0, 1, 2, made as the interpreter makes them."""
    enc, out_err = sys.stdout.encoding, sys.stdout.errors
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        interactive = os.isatty(fd)
        if fd == 0:
            stream = io.TextIOWrapper(io.open(0, "rb", closefd=False), encoding=enc, errors=out_err,  # noqa: SIM115
                                      newline="\n", line_buffering=interactive)
        else:  # stderr: always line-buffered (as the interpreter makes it), its errors escaped
            stream = io.TextIOWrapper(io.open(fd, "wb", closefd=False), encoding=enc,  # noqa: SIM115
                                      errors="backslashreplace" if fd == 2 else out_err, newline="\n",
                                      line_buffering=interactive or fd == 2)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _child(kind: str, args: list[str], env: dict[str, str], cwd: str, session: bool, umask: int) -> None:
    """In the forked process: become the command, run it, exit as the interpreter would."""
    code = 1
    try:
        if session:
            os.setsid()
        if umask >= 0:
            os.umask(umask)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        _streams()
        import runpy

        if kind == "script":
            script = _harvest_script()
            sys.argv = [script, *args]
            sys.path[0] = os.path.dirname(script)
            try:
                runpy.run_path(script, run_name="__main__")
                code = 0
            except SystemExit as exc:
                code = _exit_code(exc)
        else:
            sys.argv = [kind, *args]  # run_module puts the module's file in argv[0], as -m does
            sys.path[0] = os.getcwd()
            # As under -m, the module runs as __main__ beside (not instead of) a copy imported by name.
            if kind != "harvest":
                sys.modules.pop(kind, None)
            try:
                runpy.run_module(kind, run_name="__main__", alter_sys=True)
                code = 0
            except SystemExit as exc:
                code = _exit_code(exc)
    except KeyboardInterrupt:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # the interpreter's way: die of the signal
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # noqa: BLE001 - what an uncaught exception does: the hook, then 1
        sys.excepthook(*sys.exc_info())  # type: ignore[arg-type]
        code = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # the interpreter joins non-daemon threads
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                code = code or 120
        os._exit(code)


def _send(conn: socket.socket, obj: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        conn.send(json.dumps(obj).encode())


def _returncode(info: Any) -> int:
    """``Popen.returncode`` from ``os.waitid``'s answer: the exit status, or minus the signal."""
    if info.si_code == os.CLD_EXITED:
        return int(info.si_status)
    return -int(info.si_status)


class _Command:
    """One forked command in the host: its caller's socket (None once the caller has gone) and
    whether it has exited (then it is a zombie until its caller has its exit status)."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn: socket.socket | None = conn
        self.exited = False


def host(ctl_fd: int) -> None:
    """The fork host's loop, on the control socket ``ctl_fd`` its worker passed.

    A command that exits is left unreaped (``waitid`` with ``WNOWAIT``) until its caller has read
    its exit status and closed its socket, as an unreaped child of the caller's own would be: while
    the caller may still signal its pid (or its group), that pid is not free for another process.
    """
    import importlib

    from harvest.cli.main import COMMANDS

    for module in sorted({m for m, _ in COMMANDS.values()} | set(_PRELOAD_EXTRA)):
        importlib.import_module(module)
    assert threading.active_count() == 1, "the fork host must be single-threaded"
    ctl = socket.socket(fileno=ctl_fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(ctl, selectors.EVENT_READ, "ctl")
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    commands: dict[int, _Command] = {}  # pid -> the command
    by_conn: dict[int, int] = {}  # a caller's socket fd -> pid

    def forget(pid: int) -> None:
        """Reap an exited command whose caller has gone."""
        os.waitpid(pid, 0)
        del commands[pid]

    def caller_gone(pid: int) -> None:
        command = commands[pid]
        if command.conn is not None:
            sel.unregister(command.conn)
            by_conn.pop(command.conn.fileno(), None)
            command.conn.close()
            command.conn = None
        if command.exited:
            forget(pid)
        else:
            os.kill(pid, signal.SIGKILL)  # unreaped: still our child; reaped when it has exited

    ctl.send(b"ready")
    while True:
        for key, _ in sel.select():
            if key.data == "wake":
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
                for pid, command in list(commands.items()):
                    if command.exited:
                        continue
                    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                    if info is None:
                        continue
                    command.exited = True
                    if command.conn is None:
                        forget(pid)
                    else:
                        _send(command.conn, {"returncode": _returncode(info)})
            elif key.data == "ctl":
                try:
                    _, fds, _, _ = socket.recv_fds(ctl, 16, 5)
                except OSError:
                    fds = []
                if not fds:  # the worker has gone: end what runs, then this host
                    for pid, command in commands.items():
                        if not command.exited:
                            os.kill(pid, signal.SIGKILL)
                    os._exit(0)
                conn = socket.socket(fileno=fds[0])
                stdio = fds[1:4]
                try:
                    request = json.loads(conn.recv(_MSG))
                except (OSError, ValueError):
                    for fd in fds:
                        os.close(fd)
                    continue
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    sel.close()
                    for fd in (wake_r, wake_w, ctl.fileno(), conn.fileno(),
                               *(c.conn.fileno() for c in commands.values() if c.conn is not None)):
                        with contextlib.suppress(OSError):
                            os.close(fd)
                    for target, fd in enumerate(stdio):
                        os.dup2(fd, target)
                    for fd in stdio:
                        if fd > 2:
                            os.close(fd)
                    _child(request["kind"], request["args"], request["env"], request["cwd"], request["session"],
                           request["umask"])
                for fd in stdio:
                    os.close(fd)
                commands[pid] = _Command(conn)
                by_conn[conn.fileno()] = pid
                sel.register(conn, selectors.EVENT_READ, "conn")
                _send(conn, {"pid": pid})
            else:  # a caller: a signal for its command, or its end (after the exit status, or instead)
                conn = key.fileobj  # type: ignore[assignment]
                pid = by_conn.get(conn.fileno())  # None: closed earlier in this round
                if pid is None:
                    continue
                try:
                    data = conn.recv(_MSG)
                except OSError:
                    data = b""
                if data:
                    os.kill(pid, json.loads(data)["signal"])  # unreaped (exited or not): still ours
                else:
                    caller_gone(pid)


# --- the worker's side -----------------------------------------------------------------------------


class _Host:
    """This worker's fork host, started on first use."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ctl: socket.socket | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}
        self.failed: str | None = None

    def socket(self) -> socket.socket | None:
        with self.lock:
            if self.ctl is not None and self.proc is not None and self.proc.poll() is not None:
                self.ctl.close()  # the host has gone (killed by a test): a new one
                self.ctl = None
            if self.ctl is not None or self.failed is not None:
                return self.ctl
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self.env = dict(os.environ)
            self.proc = subprocess.Popen(
                [sys.executable, "-c", f"from tests.harvest_process import host; host({theirs.fileno()})"],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=self.env, cwd=_ROOT)
            theirs.close()
            ours.settimeout(120)
            try:
                ready = ours.recv(16)
            except OSError as exc:
                ready = f"{exc}".encode()
            ours.settimeout(None)
            if ready != b"ready":
                self.failed = f"the fork host did not start ({ready!r}, exit {self.proc.poll()})"
                print(f"tests.harvest_process: {self.failed}: fresh interpreters instead", file=sys.stderr)
                ours.close()
                with contextlib.suppress(OSError):
                    self.proc.kill()
                self.proc.wait(30)
                return None
            self.ctl = ours
            atexit.register(self.close)
            return self.ctl

    def close(self) -> None:
        with self.lock:
            if self.ctl is not None:
                self.ctl.close()
                self.ctl = None
            if self.proc is not None:
                try:
                    self.proc.wait(30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()  # the worker's own child, by the pid it started
                    self.proc.wait(30)


_HOST = _Host()


def host_pid() -> int | None:
    """The pid of this worker's fork host (None before its first command): a test that lists its
    own children tells it from what a command left behind."""
    proc = _HOST.proc
    return proc.pid if proc is not None and proc.poll() is None else None
_LIVE: set[Popen] = set()


def _forkable(argv: Sequence[Any], env: Mapping[str, str] | None,
              extra: Mapping[str, Any]) -> tuple[str, list[str]] | None:
    """How to fork ``argv`` (see :func:`_how`), or None where a fresh interpreter must run it: options
    the fork does not reproduce (``extra``), ``HARVEST_TEST_FRESH_PROCESSES=1``, no host, or an
    environment that differs from the host's in what acts at interpreter start."""
    if os.environ.get(_FRESH_ENV) == "1" or extra or isinstance(argv, (str, bytes)):
        return None
    how = _how(argv)
    if how is None:
        return None
    ctl = _HOST.socket()
    if ctl is None:
        return None
    if _start_env(env if env is not None else os.environ) != _start_env(_HOST.env):
        return None
    return how


class Popen:
    """A forked ``harvest`` command with ``subprocess.Popen``'s interface (the parts tests use)."""

    def __init__(self, args: Sequence[Any], kind: str, cmd_args: list[str], *, stdin: Any, stdout: Any,
                 stderr: Any, env: Mapping[str, str] | None, cwd: Any, text: bool, start_new_session: bool,
                 umask: int = -1) -> None:
        self.args = list(args)
        self.returncode: int | None = None
        self.stdin: Any = None
        self.stdout: Any = None
        self.stderr: Any = None
        self._text = text
        close_after: list[int] = []
        ours: list[tuple[str, int, str]] = []

        def fd_for(spec: Any, name: str, fd: int, mode: str) -> int:
            if spec is None:
                return fd  # inherited from this process, as subprocess does
            if spec == subprocess.DEVNULL:
                f = os.open(os.devnull, os.O_RDWR)
                close_after.append(f)
                return f
            if spec == subprocess.PIPE:
                r, w = os.pipe()
                mine, theirs = (w, r) if mode == "w" else (r, w)
                close_after.append(theirs)
                ours.append((name, mine, mode))
                return theirs
            if spec == subprocess.STDOUT:
                return -1
            return spec if isinstance(spec, int) else spec.fileno()

        fds = [fd_for(stdin, "stdin", 0, "w"), fd_for(stdout, "stdout", 1, "r"), fd_for(stderr, "stderr", 2, "r")]
        if fds[2] == -1:
            fds[2] = fds[1]
        for name, fd, mode in ours:  # as subprocess wraps its pipes
            f = os.fdopen(fd, mode + "b")
            if text:
                f = io.TextIOWrapper(f, encoding=locale.getpreferredencoding(False),  # type: ignore[arg-type]
                                     write_through=mode == "w")
            setattr(self, name, f)
        if umask < 0:  # the caller's own, as a child of its own would inherit it
            umask = os.umask(0o077)
            os.umask(umask)
        self._conn, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ctl = _HOST.socket()
        assert ctl is not None
        try:
            with _HOST.lock:
                socket.send_fds(ctl, [b"r"], [theirs.fileno(), *fds])
            theirs.close()
            self._conn.send(json.dumps({"kind": kind, "args": cmd_args,
                                        "env": dict(env if env is not None else os.environ),
                                        "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(),
                                        "session": start_new_session, "umask": umask}).encode())
            self.pid: int = json.loads(self._conn.recv(_MSG))["pid"]
            _LIVE.add(self)  # until its exit is collected: a forgotten command is not killed by the GC
        finally:
            for fd in close_after:
                os.close(fd)

    def _collect(self, timeout: float | None) -> int | None:
        if self.returncode is not None:
            return self.returncode
        self._conn.settimeout(timeout)
        try:
            data = self._conn.recv(_MSG)
        except (TimeoutError, BlockingIOError):
            return None
        finally:
            with contextlib.suppress(OSError):
                self._conn.settimeout(None)
        # the host answers once, when it reaped the command (nothing: the host itself went)
        self.returncode = json.loads(data)["returncode"] if data else -signal.SIGKILL
        self._conn.close()
        _LIVE.discard(self)
        return self.returncode

    def poll(self) -> int | None:
        return self._collect(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._collect(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(OSError):
                self._conn.send(json.dumps({"signal": int(signum)}).encode())

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:  # noqa: A002
        end = None if timeout is None else time.monotonic() + timeout
        got: dict[str, list[Any]] = {"stdout": [], "stderr": []}

        def drain(name: str) -> None:
            stream = getattr(self, name)
            got[name].append(stream.read())
            stream.close()

        readers = [threading.Thread(target=drain, args=(n,), daemon=True) for n in ("stdout", "stderr")
                   if getattr(self, n) is not None]
        for t in readers:
            t.start()
        if self.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                if input:
                    self.stdin.write(input)
                self.stdin.close()
        for t in readers:
            t.join(None if end is None else max(0.0, end - time.monotonic()))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(None if end is None else max(0.0, end - time.monotonic()))
        return (got["stdout"][0] if got["stdout"] else None), (got["stderr"][0] if got["stderr"] else None)

    def __enter__(self) -> Popen:
        return self

    def __exit__(self, *exc: object) -> None:
        for s in (self.stdout, self.stderr, self.stdin):
            if s is not None:
                with contextlib.suppress(OSError, ValueError):
                    s.close()
        self.wait()


def popen(args: Sequence[Any], *, stdin: Any = None, stdout: Any = None, stderr: Any = None,
          env: Mapping[str, str] | None = None, cwd: Any = None, text: bool = False,
          universal_newlines: bool = False, start_new_session: bool = False, umask: int = -1, **extra: Any) -> Any:
    """``subprocess.Popen(args, ...)``, forked from the host when ``args`` is a harvest command (any
    other keyword argument: a fresh interpreter)."""
    text = text or universal_newlines
    how = _forkable(args, env, extra)
    if how is None:
        return subprocess.Popen(args, stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=cwd, text=text,
                                start_new_session=start_new_session, umask=umask, **extra)
    return Popen(args, how[0], how[1], stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=cwd, text=text,
                 start_new_session=start_new_session, umask=umask)


def run(args: Sequence[Any], *, input: Any = None, capture_output: bool = False,  # noqa: A002
        timeout: float | None = None, check: bool = False, stdin: Any = None, stdout: Any = None,
        stderr: Any = None, env: Mapping[str, str] | None = None, cwd: Any = None, text: bool = False,
        universal_newlines: bool = False, **extra: Any) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run(args, ...)``, forked from the host when ``args`` is a harvest command (any
    other keyword argument: a fresh interpreter)."""
    text = text or universal_newlines
    how = _forkable(args, env, {k: v for k, v in extra.items() if k not in ("start_new_session", "umask")})
    if how is None:
        return subprocess.run(args, input=input, capture_output=capture_output, timeout=timeout, check=check,
                              stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=cwd, text=text, **extra)
    if capture_output:
        stdout = stderr = subprocess.PIPE
    if input is not None:
        stdin = subprocess.PIPE
    # Output to files, read back at the end: no pipe to drain while waiting, no thread.
    with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f:
        proc = Popen(args, how[0], how[1], stdin=stdin,
                     stdout=out_f if stdout == subprocess.PIPE else stdout,
                     stderr=err_f if stderr == subprocess.PIPE else stderr, env=env, cwd=cwd, text=text,
                     start_new_session=bool(extra.get("start_new_session", False)), umask=int(extra.get("umask", -1)))
        if proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.write(input)
                proc.stdin.close()

        def read(f: Any, wanted: bool) -> Any:
            if not wanted:
                return None
            f.seek(0)
            data = f.read()
            # as subprocess.run decodes: the locale's encoding, universal newlines
            return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n") \
                if text else data

        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise subprocess.TimeoutExpired(args, timeout or 0, read(out_f, stdout == subprocess.PIPE),
                                            read(err_f, stderr == subprocess.PIPE)) from None
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        out, err = read(out_f, stdout == subprocess.PIPE), read(err_f, stderr == subprocess.PIPE)
    done = subprocess.CompletedProcess(list(args), code, out, err)
    if check:
        done.check_returncode()
    return done


__all__ = ["Popen", "host_pid", "popen", "run"]

