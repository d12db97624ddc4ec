"""``harvest init --engine E -o job.toml``: for every engine, a commented file that harvest's own
loader reads and that ``harvest preflight`` judges without a configuration error (exit 0 or 1,
never 2); its comments are the fields' own descriptions; an existing file is kept."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harvest.cli.init import ENGINES
from harvest.config import ServerConfig, load_config
from tests import harvest_process


def harvest(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([sys.executable, "-m", "harvest", *argv], cwd=cwd, capture_output=True, text=True,
                               timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("engine", ENGINES)
def test_init_writes_a_job_that_loads_and_preflight_reads(tmp_path, engine):
    out = harvest("init", "--engine", engine, "-o", "job.toml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    text = (tmp_path / "job.toml").read_text()
    config = load_config(tmp_path / "job.toml")
    assert config.server is not None and config.server.engine == engine and config.data is not None
    assert "# port the engine listens on" in text or engine == "openai"
    assert "# the dataset: JSONL" in text
    described = ServerConfig.model_fields["engine"].description or ""
    assert " ".join(described.split()[:6]) in " ".join(line.lstrip("# ") for line in text.splitlines())
    checked = harvest("preflight", "job.toml", cwd=tmp_path)
    assert checked.returncode in (0, 1), checked.stdout + checked.stderr
    assert "invalid configuration" not in checked.stderr


def test_init_keeps_an_existing_file_unless_forced(tmp_path):
    (tmp_path / "job.toml").write_text("# mine\n")
    kept = harvest("init", "--engine", "vllm", "-o", "job.toml", cwd=tmp_path)
    assert kept.returncode == 2 and "job.toml exists" in kept.stderr
    assert (tmp_path / "job.toml").read_text() == "# mine\n"
    forced = harvest("init", "--engine", "vllm", "-o", "job.toml", "--force", cwd=tmp_path)
    assert forced.returncode == 0 and 'engine = "vllm"' in (tmp_path / "job.toml").read_text()


def test_each_template_says_what_its_engine_takes_and_where_it_comes_from():
    from harvest.cli.init import job_text

    def comments_above(text: str, key: str) -> str:
        lines = text.splitlines()
        at = next(i for i, ln in enumerate(lines) if ln.startswith(f"{key} = "))
        above = []
        for ln in reversed(lines[:at]):
            if not ln.startswith("#"):
                break
            above.insert(0, ln.lstrip("# "))
        return " ".join(above)

    llama = job_text("llamacpp")
    assert "GGUF file (-m)" in comments_above(llama, "model")
    assert "`scripts/install-engines llamacpp` builds one" in comments_above(llama, "command")
    vllm = job_text("vllm")
    assert "gpus = [] runs vLLM's CPU build" in comments_above(vllm, "gpus")
    assert "`scripts/install-engines vllm` installs the CPU build" in comments_above(vllm, "python")
    assert "SGLang needs an NVIDIA GPU" in comments_above(job_text("sglang"), "gpus")
