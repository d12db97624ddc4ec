"""Mistakes in the flags of a job, said as a person typed them: two flags that set one setting to
two values are refused (neither wins silently); a value is shown as TOML (``true``, ``['a']``), as it
is typed after ``--set``; a ``--set`` value that starts as a TOML list, table or string and does not
parse is refused instead of becoming a text; a run without a dataset says to give ``--data``. In
process (click's runner and the Python API): nothing here reaches an engine."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import harvest
import harvest.api
from harvest.cli.main import cli

ENDPOINT = ["--engine", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"]


def run(tmp_path, *argv: str):
    (tmp_path / "p.jsonl").write_text('{"prompt": "hi"}\n')
    return CliRunner().invoke(cli, ["run", *argv, "--out", str(tmp_path / "run"), "--no-live"],
                              env={"COLUMNS": "200"})


@pytest.mark.parametrize(("argv", "says"), [
    (["--max-tokens", "16", "--set", "sampling.max_tokens=32"],
     "--max-tokens and --set sampling.max_tokens: both set [sampling] max_tokens, to 16 and 32: give one"),
    (["--set", "sampling.max_tokens=true"], "([sampling] max_tokens): Input should be a valid integer (got true)"),
    (["--set", 'server.extra_args=["a"'], '--set server.extra_args: ["a" is not a TOML value ('),
    (["--set", "data.system_prompt={a = 1"], "--set data.system_prompt: {a = 1 is not a TOML value ("),
])
def test_a_flag_mistake_is_said_as_it_was_typed(tmp_path, argv, says):
    out = run(tmp_path, *ENDPOINT, "--data", str(tmp_path / "p.jsonl"), *argv)
    assert out.exit_code == 2, out.output
    assert says in out.output, out.output
    assert not (tmp_path / "run").exists()


def test_the_same_value_twice_is_no_conflict_and_a_text_needs_no_quotes(tmp_path):
    cfg = harvest.api.load_job(engine="openai", base_url="http://127.0.0.1:9/v1", model="m", max_tokens=16,
                               settings={"sampling.max_tokens": 16, "data.path": "p.jsonl",
                                         "data.system_prompt": "be brief"})
    assert cfg.sampling.max_tokens == 16 and cfg.data is not None and cfg.data.system_prompt == "be brief"
    with pytest.raises(harvest.ConfigError, match=r"max_tokens= and settings\['sampling.max_tokens'\]: both set "):
        harvest.api.load_job(engine="openai", base_url="http://127.0.0.1:9/v1", model="m", max_tokens=16,
                             settings={"sampling.max_tokens": 32})


def test_a_run_without_a_dataset_says_to_give_data(tmp_path):
    out = run(tmp_path, *ENDPOINT)
    assert out.exit_code == 2 and "`harvest run` needs a dataset: give --data FILE" in out.output, out.output
    (tmp_path / "job.toml").write_text('[server]\nengine = "openai"\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n')
    out = run(tmp_path, str(tmp_path / "job.toml"))
    assert out.exit_code == 2, out.output
    assert (f"`harvest run` needs a dataset: add a [data] table with its path to {tmp_path / 'job.toml'}, or give "
            "--data FILE") in out.output, out.output
