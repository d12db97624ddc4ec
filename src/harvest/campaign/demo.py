"""The demo campaign: a tiny local model on vLLM's CPU build, end to end.

Builds the tiny random-weight model if it is missing (a locally trained tokenizer, no hub), writes a
job file next to the run, and runs preflight -> launch -> run -> verified stop -> export. The
prompts are the package's own ``demo/prompts.jsonl``. Nothing here is special-cased: the demo is a
normal job, and its folder can be resumed, inspected and exported like any other.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
from pathlib import Path

from harvest import safefiles
from harvest.errors import ConfigError

DEMO_DIR = Path(__file__).resolve().parent.parent / "demo"
MAKE_MODEL = DEMO_DIR / "make_tiny_model.py"
PROMPTS = DEMO_DIR / "prompts.jsonl"


def models_cache() -> Path:
    root = os.environ.get("HARVEST_MODELS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "harvest", "models")
    return Path(root)


def tiny_model_dir() -> Path:
    """Where the tiny model lives: keyed by the builder's content, so a changed recipe rebuilds."""
    digest = hashlib.blake2b(MAKE_MODEL.read_bytes(), digest_size=6).hexdigest()
    return models_cache() / f"tiny-{digest}"


#: What to do when the demo's Python has no vLLM: the README's first command installs it.
NO_VLLM_FIX = ("run `make demo` from the clone (it installs vLLM's CPU build with scripts/install-engines "
               "and passes its Python), or give --engine-python PATH of a Python that has vLLM")


def check_engine_python(engine_python: str, *, timeout: float = 60.0) -> None:
    """Refuse, in one line with the fix, a demo Python that cannot run vLLM (no vLLM or no PyTorch):
    found by the import system, without importing vLLM (seconds)."""
    # Prints the missing modules (one line, comma-separated) and exits 3 only when one is missing:
    # `sys.exit('')` would exit 1 with nothing missing.
    probe = ("import importlib.util as u, sys\n"
             "m = [n for n in ('vllm', 'torch') if u.find_spec(n) is None]\n"
             "if m:\n    print(','.join(m)); sys.exit(3)\n")
    try:
        proc = subprocess.run([engine_python, "-c", probe], capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise ConfigError("harvest demo", [("--engine-python", f"{engine_python} does not exist; {NO_VLLM_FIX}")]) \
            from None
    except (subprocess.TimeoutExpired, OSError) as exc:
        raise ConfigError("harvest demo", [("--engine-python", f"{engine_python} did not start: {exc}")]) from None
    if proc.returncode == 0:
        return
    # Exit 3 with the names printed: what is missing; any other failure (not a Python, a broken
    # interpreter): said as "no vLLM", with its own last line of stderr.
    missing = proc.stdout.strip().splitlines()[-1] if proc.returncode == 3 and proc.stdout.strip() else ""
    names = {"vllm": "vLLM", "torch": "PyTorch"}
    what = " nor ".join(names.get(m, m) for m in missing.split(",")) if missing else "vLLM"
    raise ConfigError("harvest demo", [("--engine-python", f"{engine_python} has no {what}: the demo runs "
                                                           f"vLLM's CPU build; {NO_VLLM_FIX}")])


def ensure_tiny_model(engine_python: str, *, timeout: float = 900.0) -> Path:
    """Build the tiny model with the engine's Python unless it is already there."""
    out = tiny_model_dir()
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    tmp = out.with_name(out.name + f".building-{secrets.token_hex(16)}")  # a name no one can plant first
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run([engine_python, str(MAKE_MODEL), str(tmp)], capture_output=True, text=True,
                              timeout=timeout)
    except FileNotFoundError:
        raise ConfigError("harvest demo", [("--engine-python", f"{engine_python} does not exist")]) from None
    except subprocess.TimeoutExpired:
        raise ConfigError("harvest demo", [("tiny model", f"building it took over {timeout:.0f} s")]) from None
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-5:]
        last = tail[-1] if tail else "no output"  # a traceback's last line says what went wrong
        raise ConfigError("harvest demo", [("--engine-python", f"{engine_python} could not build the tiny model "
                                            f"(exit {proc.returncode}): {last}")])
    if not out.exists():
        os.replace(tmp, out)
    return out


def write_demo_job(workdir: Path, *, engine_python: str, model: Path, port: int, max_tokens: int,
                   concurrency: int) -> Path:
    """The demo's job file (TOML), written into ``workdir``."""
    safefiles.ensure_dir(workdir)  # it will hold the run folder: this user's own
    job = workdir / "job.toml"
    q = json.dumps  # TOML basic strings share JSON's escapes for these values
    safefiles.write_atomic(job, (
        "# The demo job: written by `harvest demo`; run it again with `harvest run job.toml`.\n"
        "[server]\n"
        'engine = "vllm"\n'
        f"model = {q(str(model))}\n"
        f"python = {q(engine_python)}\n"
        'host = "127.0.0.1"\n'
        f"port = {port}\n"
        "ready_timeout = 300\n"
        'extra_args = ["--max-model-len", "2048"]\n\n'
        "[server.env]\n"
        'VLLM_CPU_KVCACHE_SPACE = "1"\n'
        'HF_HUB_OFFLINE = "1"\n'
        'VLLM_NO_USAGE_STATS = "1"\n\n'
        "[preflight]\n"
        "min_disk_free_gib = 1\n"
        "ram_reserve_gib = 2\n\n"
        "[data]\n"
        f"path = {q(str(PROMPTS))}\n"
        'id_field = "id"\n\n'
        "[sampling]\n"
        f"max_tokens = {max_tokens}\n"
        "temperature = 0.0\n\n"
        "[client]\n"
        f"concurrency = {concurrency}\n"
        "health_deadline = 120\n\n"
        "[output]\n"
        'dir = "run"\n'
    ))
    return job


__all__ = ["PROMPTS", "ensure_tiny_model", "models_cache", "tiny_model_dir", "write_demo_job"]
