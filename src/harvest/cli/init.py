"""``harvest init``: write a commented job file for one engine, to start a job from.

The file is built with tomlkit (a maintained TOML writer that keeps comments) from the settings a
first job needs for that engine; each setting's comment is its field's own description, the text
docs/config.md is generated from, so the two never disagree. What it writes loads with harvest's
own loader and ``harvest preflight`` reads it without a configuration error (tests/cli/test_init.py).
Nothing here launches or probes anything.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any, get_args

import click
from pydantic import BaseModel

from harvest import safefiles
from harvest.config import (
    ClientConfig,
    DataConfig,
    EngineKind,
    OutputConfig,
    SamplingConfig,
    ServerConfig,
)

#: The [server] of a first job, per engine: (key, value). Placeholders a user replaces are named so.
SERVERS: dict[str, list[tuple[str, Any]]] = {
    "vllm": [("engine", "vllm"), ("model", "Qwen/Qwen3-8B"), ("python", "/opt/vllm-venv/bin/python"),
             ("port", 8000), ("gpus", [0]), ("tp", 1), ("gpu_memory_utilization", 0.9),
             ("max_running_requests", 256), ("extra_args", ["--max-model-len", "8192"])],
    "sglang": [("engine", "sglang"), ("model", "Qwen/Qwen3-8B"), ("python", "/opt/sglang-venv/bin/python"),
               ("port", 30000), ("gpus", [0]), ("tp", 1), ("mem_fraction_static", 0.85),
               ("max_running_requests", 256), ("extra_args", ["--context-length", "8192"])],
    "transformers": [("engine", "transformers"), ("model", "Qwen/Qwen3-0.6B"),
                     ("python", "/opt/transformers-venv/bin/python"), ("port", 8000), ("gpus", [0])],
    "llamacpp": [("engine", "llamacpp"), ("model", "/models/qwen3-8b-q4_k_m.gguf"),
                 ("command", ["/opt/llama.cpp/build/bin/llama-server"]), ("port", 8080),
                 ("max_running_requests", 8), ("extra_args", ["-c", "32768"])],
    "openai": [("engine", "openai"), ("base_url", "http://127.0.0.1:8000/v1"), ("model", "Qwen/Qwen3-8B")],
    "command": [("engine", "command"), ("model", "my-model"),
                ("command", ["/opt/my-server/bin/serve", "--host", "{host}", "--port", "{port}", "--model", "{model}"]),
                ("health_url", "http://{host}:{port}/health"), ("port", 8000)],
}

#: What a setting means for one engine, said after its field's own description: (engine, key) -> note.
NOTES: dict[tuple[str, str], str] = {
    ("llamacpp", "model"): "llama-server loads one GGUF file (-m): give its path",
    ("llamacpp", "command"): "the llama-server binary: `scripts/install-engines llamacpp` builds one and prints its "
                             "path (or put llama-server on PATH and leave `command` out)",
    ("vllm", "python"): "the Python of vLLM's environment: `scripts/install-engines vllm` installs the CPU build and "
                        "prints its Python",
    ("vllm", "gpus"): "no NVIDIA GPU here? gpus = [] runs vLLM's CPU build (its `python`); gpu_memory_utilization is "
                      "then the share of the RAM its KV cache takes",
    ("sglang", "gpus"): "SGLang needs an NVIDIA GPU (without one: engine vllm's CPU build, llamacpp or transformers)",
    ("transformers", "gpus"): "no NVIDIA GPU here? gpus = [] runs it on the CPU",
}

#: The other tables of a first job: (table, model, [(key, value)]).
TABLES: list[tuple[str, type[BaseModel], list[tuple[str, Any]]]] = [
    ("data", DataConfig, [("path", "prompts.jsonl"), ("id_field", "id")]),
    ("sampling", SamplingConfig, [("max_tokens", 1024), ("temperature", 0.0)]),
    ("client", ClientConfig, [("concurrency", "auto")]),
    ("output", OutputConfig, [("dir", "runs/first-job")]),
]

ENGINES = list(get_args(EngineKind))


def _comment(model: type[BaseModel], key: str) -> str:
    text = (model.model_fields[key].description or "").strip()
    return " ".join(text.split())


def _table(model: type[BaseModel], items: list[tuple[str, Any]], engine: str | None = None) -> Any:
    import tomlkit

    table = tomlkit.table()
    for key, value in items:
        note = NOTES.get((engine or "", key))
        for line in textwrap.wrap(_comment(model, key) + (f". {note[0].upper()}{note[1:]}" if note else ""), width=98):
            table.add(tomlkit.comment(line))
        table.add(key, value)
    return table


def job_text(engine: str) -> str:
    """The commented job file for ``engine``."""
    import tomlkit

    doc = tomlkit.document()
    doc.add(tomlkit.comment(f"A harvest job for {engine}, written by `harvest init --engine {engine}`."))
    doc.add(tomlkit.comment("Replace the model, the paths and the data with yours; every setting: docs/config.md."))
    doc.add(tomlkit.comment("Check it with `harvest preflight FILE`, run it with `harvest run FILE`."))
    doc.add(tomlkit.nl())
    doc.add("server", _table(ServerConfig, SERVERS[engine], engine))
    for name, model, items in TABLES:
        doc.add(name, _table(model, items))
    return tomlkit.dumps(doc)


@click.command("init")
@click.option("--engine", required=True, type=click.Choice(ENGINES),
              help="the engine the job uses (openai: a server that is already running)")
@click.option("-o", "--output", "output", default="job.toml", show_default=True,
              type=click.Path(dir_okay=False, path_type=Path), help="the job file to write (- prints it)")
@click.option("--force", is_flag=True, help="replace the file if it exists")
def init(engine: str, output: Path, force: bool) -> None:
    """Write a commented job file for ENGINE to start a job from."""
    text = job_text(engine)
    if str(output) == "-":
        click.echo(text, nl=False)
        return
    if output.exists() and not force:
        click.echo(f"error: {output} exists; give another -o FILE, or --force to replace it", err=True)
        sys.exit(2)
    safefiles.write_atomic(output, text)
    click.echo(f"wrote {output}: a {engine} job; edit the model and [data] path, then "
               f"`harvest preflight {output}` and `harvest run {output}`")


__all__ = ["ENGINES", "init", "job_text"]
