"""`harvest demo` with a Python that cannot run vLLM: one error with the fix (`make demo`), exit 2,
and no folder left behind. A real interpreter without vLLM: this test's own Python (harvest's
environment never holds vLLM; the engine lives in its own environment)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from tests import harvest_process


def demo(tmp_path, python: str) -> subprocess.CompletedProcess[str]:
    return harvest_process.run([sys.executable, "-m", "harvest", "demo", "--dir", str(tmp_path / "demo"),
                           "--engine-python", python], capture_output=True, text=True, timeout=120, check=False)


def test_a_python_without_vllm_points_to_make_demo(tmp_path):
    assert importlib.util.find_spec("vllm") is None, "harvest's own environment must not hold vLLM"
    out = demo(tmp_path, sys.executable)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"--engine-python: {sys.executable} has no vLLM" in out.stderr
    assert "run `make demo` from the clone" in out.stderr
    assert "Traceback" not in out.stderr and "|" not in out.stderr
    assert not (tmp_path / "demo").exists()


def test_a_missing_python_is_named_with_the_fix(tmp_path):
    out = demo(tmp_path, str(tmp_path / "no-such-python"))
    assert out.returncode == 2
    assert f"{tmp_path / 'no-such-python'} does not exist; run `make demo`" in out.stderr
    assert not (tmp_path / "demo").exists()


def fake_packages(root, *names: str) -> str:
    """A folder with an empty package per name: what the import system finds, as in a real environment."""
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text("")
    return str(root)


def test_the_probe_passes_a_python_with_vllm_and_pytorch(tmp_path, monkeypatch):
    from harvest.campaign.demo import check_engine_python

    monkeypatch.setenv("PYTHONPATH", fake_packages(tmp_path / "site", "vllm", "torch"))
    assert check_engine_python(sys.executable) is None


def test_the_probe_names_what_is_missing(tmp_path, monkeypatch):
    import pytest

    from harvest.campaign.demo import check_engine_python
    from harvest.errors import ConfigError

    monkeypatch.setenv("PYTHONPATH", fake_packages(tmp_path / "only-vllm", "vllm"))
    with pytest.raises(ConfigError) as only_vllm:
        check_engine_python(sys.executable)
    assert f"{sys.executable} has no PyTorch: the demo runs vLLM's CPU build" in str(only_vllm.value)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "empty"))
    with pytest.raises(ConfigError) as neither:
        check_engine_python(sys.executable)
    assert f"{sys.executable} has no vLLM nor PyTorch" in str(neither.value)
