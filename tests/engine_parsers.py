"""An engine's argument parser, imported once per test session and run many times.

The contract tests run code in an engine's own Python (vLLM's or SGLang's) against its real parser.
Importing vLLM's parser costs 11-17 s of CPU on a 2-core machine; four tests each paying it was
about 70 s of the suite's CPU. ``ParserHost`` starts the engine's Python once, imports the parser's
modules there, and runs each piece of code in a fork of that process: the code runs as
``python -c CODE ARGS`` would (``__name__ == "__main__"``, ``sys.argv``, stdin, its exit status,
its own stdout and stderr), on the modules already imported. Nothing of the parser is replaced.

The host is this test process's child, started with a Popen handle and stopped by it (stdin closed,
then SIGKILL of that pid after a grace); every wait is bounded.
"""

from __future__ import annotations

import json
import queue
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass

#: What each engine's host imports before its first fork: the modules the parser code needs.
PRELOAD = {
    "vllm": ["vllm.entrypoints.launchers.cli_args", "vllm.utils.argparse_utils"],
    "sglang": ["sglang", "sglang.srt.server_args"],
}
#: The line prefix of a host's answers (the engine's imports may print to stdout).
ANSWER = "HARVEST-PARSER-HOST "

#: Runs in the engine's Python: imports the modules named in argv, then answers each request line
#: on stdin ({"code", "argv", "stdin", "timeout"}) with one line {"returncode", "stdout", "stderr"} from a
#: fork, which SIGALRM ends once its timeout passes.
HOST = r'''
import importlib, io, json, os, signal, sys, tempfile, traceback
for name in sys.argv[1:]:
    importlib.import_module(name)
answers = os.fdopen(os.dup(1), "w")
answers.write("''' + ANSWER + r'''" + json.dumps({"ready": True}) + "\n")
answers.flush()
for line in sys.stdin:
    req = json.loads(line)
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    pid = os.fork()
    if pid == 0:
        code = 0
        signal.alarm(max(1, int(req["timeout"])))  # a fork that outlives its caller's wait ends by itself
        try:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), write_through=True)
            sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), write_through=True)
            sys.stdin = io.StringIO(req["stdin"])
            sys.argv = ["-c", *req["argv"]]
            exec(compile(req["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    texts = []
    for f in (out, err):
        f.seek(0)
        texts.append(f.read().decode("utf-8", "replace"))
        f.close()
    answers.write("''' + ANSWER + r'''" + json.dumps({"returncode": os.waitstatus_to_exitcode(status),
                                          "stdout": texts[0], "stderr": texts[1]}) + "\n")
    answers.flush()
'''


@dataclass(frozen=True)
class Done:
    """What one run gave, as ``subprocess.CompletedProcess`` names it."""

    returncode: int
    stdout: str
    stderr: str


class ParserHost:
    """One engine's Python with its parser imported; :meth:`run` runs code in a fork of it."""

    def __init__(self, python: str, engine: str, *, timeout: float = 600.0):
        self.python, self.engine = python, engine
        self._log = tempfile.TemporaryFile()  # the host's own stderr (the engine's import logs): never a full pipe
        self._proc = subprocess.Popen([python, "-c", HOST, *PRELOAD[engine]], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1)
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self._read(timeout, "to import its parser")

    def _pump(self) -> None:
        """The host's stdout, line by line, into the queue; "" once it ends."""
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.put(line)
        self._lines.put("")

    def _read(self, timeout: float, what: str) -> dict:
        """The host's next answer line, waiting at most ``timeout`` seconds."""
        while True:
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                self.close()
                raise TimeoutError(f"{self.engine}'s parser host ({self.python}) gave no answer within "
                                   f"{timeout:g} s {what}") from None
            if not line:
                code = self._proc.wait(10)
                self._log.seek(0)
                err = self._log.read().decode("utf-8", "replace")
                raise RuntimeError(f"{self.engine}'s parser host ({self.python}) exited ({code}) {what}:\n"
                                   f"{err[-4000:]}")
            if line.startswith(ANSWER):
                return json.loads(line[len(ANSWER):])

    def run(self, code: str, argv: Sequence[str] = (), stdin: str = "", *, timeout: float = 600.0) -> Done:
        """``python -c code *argv`` with ``stdin``, on the imported parser."""
        assert self._proc.stdin is not None
        request = {"code": code, "argv": list(argv), "stdin": stdin, "timeout": timeout}
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        got = self._read(timeout, "to a run")
        return Done(got["returncode"], got["stdout"], got["stderr"])

    def close(self) -> None:
        """Stop the host: its stdin closed (it ends its loop), then SIGKILL of its pid after 10 s."""
        if self._proc.poll() is None:
            try:
                if self._proc.stdin is not None:
                    self._proc.stdin.close()
                self._proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait(10)
        self._log.close()


class ParserHosts:
    """The session's hosts, one per (engine, Python), each started when first asked for."""

    def __init__(self) -> None:
        self._hosts: dict[tuple[str, str], ParserHost] = {}

    def get(self, engine: str, python: str) -> ParserHost:
        key = (engine, python)
        if key not in self._hosts:
            self._hosts[key] = ParserHost(python, engine)
        return self._hosts[key]

    def run(self, engine: str, python: str, code: str, argv: Sequence[str] = (), stdin: str = "",
            *, timeout: float = 600.0) -> Done:
        return self.get(engine, python).run(code, argv, stdin, timeout=timeout)

    def close(self) -> None:
        for host in self._hosts.values():
            host.close()
        self._hosts.clear()


__all__ = ["ANSWER", "Done", "ParserHost", "ParserHosts", "PRELOAD"]
