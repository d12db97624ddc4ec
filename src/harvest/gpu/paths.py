"""The preflight's ``paths`` rule: every path a job names is there, of the kind it must be, where it
is used (the engine's Python or binary and a local model where the engine runs; the data where
harvest reads it), each missing one named with its fix. And what to set for a CPU engine when the
machine has no NVIDIA GPU.

The paths come in as :class:`~harvest.checks.NamedPath` values from the layer that knows the engine
(``harvest.server.engine_paths``); this module only looks at the file system, never follows a
guess: an executable name without a slash is looked up on PATH as exec would look it up.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence

from harvest.checks import NamedPath, Number, RuleResult
from harvest.config import RELATIVE_PATHS, DataConfig

PATHS = "paths"
#: What makes a folder a model's checkpoint: Hugging Face's config, or Mistral's own format's.
MODEL_CONFIGS = ("config.json", "params.json")

#: What to set on a machine without an NVIDIA GPU, per engine (``[server] gpus`` lists some).
CPU_ENGINE_HINTS: Mapping[str, str] = {
    "vllm": "for vLLM's CPU build set [server] gpus = [] and python = its Python (scripts/install-engines vllm "
            "installs it and prints the path); gpu_memory_utilization is then its share of the RAM",
    "llamacpp": "llama-server runs on the CPU: set [server] gpus = []",
    "transformers": "transformers serve runs on the CPU: set [server] gpus = []",
    "sglang": "SGLang needs an NVIDIA GPU: on this machine use engine \"vllm\" (its CPU build), \"llamacpp\" or "
              "\"transformers\", with [server] gpus = []",
    "command": "if the command runs on the CPU, set [server] gpus = []",
}


def cpu_hint(engine: str) -> str:
    """What to set for a CPU engine, on a machine without an NVIDIA GPU."""
    return f"no GPU here: {CPU_ENGINE_HINTS.get(engine, CPU_ENGINE_HINTS['command'])}"


def data_paths(data: DataConfig | None) -> tuple[NamedPath, ...]:
    """The dataset a job reads, where harvest reads it (the machine ``harvest run`` runs on)."""
    if data is None:
        return ()
    return (NamedPath("[data] path", data.path, "file or folder",
                      f"give the dataset's path in [data] path or --data ({RELATIVE_PATHS})"),)


def missing(named: NamedPath, env: Mapping[str, str] | None = None) -> str | None:
    """Why ``named`` is not usable (``does not exist``, ``is a folder``, ``is not on PATH (...)``),
    or None when it is."""
    path = named.path
    if named.kind == "executable":
        if "/" not in path:
            search = (env if env is not None else os.environ).get("PATH", os.defpath)
            return None if shutil.which(path, path=search) else f"is not on PATH ({search})"
        if not os.path.exists(path):
            return "does not exist"
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            return "is not an executable file"
        return None
    if not os.path.exists(path):
        return "does not exist"
    if named.kind == "file" and os.path.isdir(path):
        return "is a folder, not a file"
    if named.kind == "model" and os.path.isdir(path) and not any(
            os.path.isfile(os.path.join(path, name)) for name in MODEL_CONFIGS):
        # the engine would fail on it after its imports, minutes into a GPU launch
        return f"is a folder without {' or '.join(MODEL_CONFIGS)}, not a model's checkpoint"
    if not os.access(path, os.R_OK):
        return "is not readable by this user"
    return None


def paths_rule(paths: Sequence[NamedPath], env: Mapping[str, str] | None = None) -> RuleResult:
    """One result for every path: each missing one with its field, path, why and fix."""
    numbers: dict[str, Number] = {"checked": len(paths)}
    if not paths:
        return RuleResult(PATHS, True, "no local path named (a hub model name is fetched by the engine)",
                          numbers=numbers)
    problems = []
    for named in paths:
        why = missing(named, env)
        if why is not None:
            problems.append(f"{named.field} {named.path} {why}: {named.fix}")
    numbers["missing"] = len(problems)
    if problems:
        return RuleResult(PATHS, False, "; ".join(problems), numbers=numbers)
    shown = ", ".join(f"{n.field} {n.path}" for n in paths)
    return RuleResult(PATHS, True, f"there: {shown}", numbers=numbers)


__all__ = ["CPU_ENGINE_HINTS", "MODEL_CONFIGS", "PATHS", "cpu_hint", "data_paths", "missing", "paths_rule"]
