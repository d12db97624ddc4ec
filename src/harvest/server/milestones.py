"""What a launching engine is doing, from its log: the last line that matters, for a display.

    line = last_milestone(new_text)          # "Loading model weights took 0.12 GB", or None

An engine's start-up log is mostly noise (routes, warnings, environment dumps); the lines a person
waiting on a launch wants are the steps: loading weights, profiling memory, sizing the KV cache,
compiling, capturing CUDA graphs, starting the HTTP server. The match is by keyword over what
vLLM, SGLang and llama.cpp print, with the engines' own prefixes (level, timestamp, source file,
worker name) removed. Informative only: readiness and fatal lines are decided elsewhere
(:mod:`harvest.server.readiness`); nothing here changes how a launch goes.
"""

from __future__ import annotations

import re

from harvest.events import Listener, emit
from harvest.redact import redact_text, safe_line
from harvest.server.base import ReadinessCheck

#: Longest line handed to a display.
MAX_CHARS = 100

_PREFIXES = (
    re.compile(r"^\((?:[^()]|\([^()]*\))*\)\s*"),                                   # vLLM "(EngineCore_DP0 pid=1)"
    re.compile(r"^(?:INFO|WARNING|WARN|DEBUG|ERROR)\s+\d\d-\d\d\s+[\d:.]+\s*(?:\[[^\]]*\]\s*)?"),  # vLLM
    re.compile(r"^\[\d{4}-\d\d-\d\d[ T][\d:.,]+(?:\s+[A-Z]+\d*)*\]\s*"),               # SGLang "[... TP0]"
    re.compile(r"^(?:INFO|WARNING|DEBUG|ERROR):\s+"),                                # uvicorn
    re.compile(r"^(?:srv|main|llama_model_loader|load_tensors|common_init_from_params|llama_context)"
               r"\s*:?\s+(?:\w+:\s+)?"),                                            # llama.cpp
)

_MATTERS = re.compile(
    r"load(?:ing|ed)?\b|weight|checkpoint|shard|cuda ?graph|captur|compil|warm.?up|kv cache|"
    r"(?:cpu|gpu) blocks|memory profil|profil|startup|listening|initializ|init engine|"
    r"starting|tokenizer|download|allocat|ready", re.IGNORECASE)

_NOISE = re.compile(r"^route:|deprecat|futurewarning|userwarning", re.IGNORECASE)


def strip_prefix(line: str) -> str:
    """``line`` without the engine's level / time / source / worker prefixes."""
    line = line.strip().rsplit("\r", 1)[-1].strip()  # a progress bar redrawn with \r: its last state
    for _ in range(3):
        before = line
        for pattern in _PREFIXES:
            line = pattern.sub("", line, count=1)
        if line == before:
            break
    return line.strip()


def milestone(line: str) -> str | None:
    """The line, cleaned and shortened, when it says a start-up step; else None."""
    text = strip_prefix(line)
    if not text or _NOISE.search(text) or not _MATTERS.search(text):
        return None
    text = safe_line(text)  # shown on the console: no secret flag's value, no terminal control
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS - 1] + "…"


def last_milestone(text: str) -> str | None:
    """The last line of ``text`` that says a start-up step (None when none does)."""
    for line in reversed(text.splitlines()):
        found = milestone(line)
        if found is not None:
            return found
    return None




class LaunchReporter:
    """The ``on_poll`` of a readiness wait that reports ``launching`` updates through ``listener``:
    the last start-up step seen in the log and the check being waited on, when either changes."""

    def __init__(self, listener: Listener | None, url: str):
        self.listener = listener
        self.url = url
        self.line: str | None = None
        self.waiting_on: str | None = None

    def __call__(self, check: ReadinessCheck, new_text: str) -> None:
        try:
            line = last_milestone(new_text) or self.line
            waiting_on = describe_check(check, self.url)
        except Exception:  # noqa: BLE001 - informative only: never in the way of a launch
            return
        if line != self.line or waiting_on != self.waiting_on:
            self.line, self.waiting_on = line, waiting_on
            emit(self.listener, "launching", "update", line=line, waiting_on=waiting_on)


def describe_check(check: ReadinessCheck, url: str) -> str:
    """``GET /health`` / ``port 8000 accepting`` / ``POST /generate (one-token generation)``."""
    if check.kind == "port":
        return f"{check.name}: {url.rsplit(':', 1)[-1]} accepting connections"
    target = check.url or check.path
    if target.startswith(url):  # the server's own address: the path says it all
        target = target[len(url):] or "/"
    # shown on the console: a health URL may carry a token (``?token=``, ``http://TOKEN@``)
    return redact_text(f"{check.method} {target}" + ("" if check.name in target else f" ({check.name})"))


__all__ = ["MAX_CHARS", "LaunchReporter", "describe_check", "last_milestone", "milestone", "strip_prefix"]
