"""What harvest writes down of a command line or a [server] table carries no secret."""

from __future__ import annotations

import pytest

from harvest.config import parse_config
from harvest.redact import redact_argv, redact_env, redact_text


@pytest.mark.parametrize(("argv", "want"), [
    (["--api-key", "k"], ["--api-key", "***"]),
    (["--api-key=k"], ["--api-key=***"]),
    (["--admin-api-key", "k", "--port", "1"], ["--admin-api-key", "***", "--port", "1"]),
    (["--hf-token", "k"], ["--hf-token", "***"]),
    (["--hf_token=k"], ["--hf_token=***"]),
    (["--password", "k", "--tp", "8"], ["--password", "***", "--tp", "8"]),
    (["--url", "http://u:pw@h:1/x"], ["--url", "http://u:***@h:1/x"]),
    (["--tokenizer", "m", "--max-tokens", "9"], ["--tokenizer", "m", "--max-tokens", "9"]),
    (["--kv-cache-dtype", "fp8"], ["--kv-cache-dtype", "fp8"]),
])
def test_secret_flags_lose_their_values_and_nothing_else_changes(argv, want):
    assert list(redact_argv(argv)) == want


def test_known_secrets_are_redacted_anywhere_in_an_argument():
    assert redact_argv(["--header", "Authorization: Bearer sk-1"], ["sk-1"]) == ("--header", "Authorization: Bearer ***")
    assert redact_text("no secret here", ["", "x-never"]) == "no secret here"


def test_secret_named_environment_variables_are_redacted():
    env = {"HF_TOKEN": "hf_1", "OPENAI_API_KEY": "sk", "AWS_SECRET_ACCESS_KEY": "a", "CUDA_VISIBLE_DEVICES": "0,1",
           "NCCL_DEBUG": "INFO", "DB_PASSWORD": "p"}
    assert redact_env(env) == {"HF_TOKEN": "***", "OPENAI_API_KEY": "***", "AWS_SECRET_ACCESS_KEY": "***",
                               "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "INFO", "DB_PASSWORD": "***"}


def test_the_recorded_config_redacts_server_secrets_and_keeps_the_rest(monkeypatch):
    monkeypatch.setenv("K", "sk-live-1")
    cfg = parse_config({"server": {"engine": "sglang", "model": "m", "api_key_env": "K", "tp": 8,
                                   "extra_args": ["--admin-api-key", "adm", "--watchdog", "sk-live-1"],
                                   "env": {"HF_TOKEN": "hf_x", "NCCL_DEBUG": "WARN"}},
                        "data": {"path": "d.jsonl"}}, source="job.toml")
    rec = cfg.recorded()
    assert rec["server"]["extra_args"] == ["--admin-api-key", "***", "--watchdog", "***"]
    assert rec["server"]["env"] == {"HF_TOKEN": "***", "NCCL_DEBUG": "WARN"}
    assert rec["server"]["tp"] == 8 and rec["server"]["api_key_env"] == "K"
    assert "source" not in rec
    assert cfg.server.extra_args[1] == "adm"  # the live config is untouched
