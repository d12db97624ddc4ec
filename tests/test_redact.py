"""What harvest writes down of a command line or a [server] table carries no secret."""

from __future__ import annotations

import pytest

from harvest.config import parse_config
from harvest.errors import ConfigError
from harvest.redact import escape_controls, redact_argv, redact_doc, redact_env, redact_text, safe_line


@pytest.mark.parametrize(("argv", "want"), [
    (["--api-key", "k"], ["--api-key", "***"]),
    (["--api-key=k"], ["--api-key=***"]),
    (["--admin-api-key", "k", "--port", "1"], ["--admin-api-key", "***", "--port", "1"]),
    (["--hf-token", "k"], ["--hf-token", "***"]),
    (["--hf_token=k"], ["--hf_token=***"]),
    (["--password", "k", "--tp", "8"], ["--password", "***", "--tp", "8"]),
    (["--url", "http://u:pw@h:1/x"], ["--url", "http://***@h:1/x"]),
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
                                   "extra_args": ["--watchdog", "sk-live-1"],
                                   "env": {"HF_TOKEN": "hf_x", "NCCL_DEBUG": "WARN"}},
                        "cluster": {"runtime_env": {"env_vars": {"HF_TOKEN": "hf_y", "OMP_NUM_THREADS": "1"}}},
                        "data": {"path": "d.jsonl"}}, source="job.toml")
    rec = cfg.recorded()
    assert rec["server"]["extra_args"] == ["--watchdog", "***"]
    assert rec["cluster"]["runtime_env"]["env_vars"] == {"HF_TOKEN": "***", "OMP_NUM_THREADS": "1"}
    assert rec["server"]["env"] == {"HF_TOKEN": "***", "NCCL_DEBUG": "WARN"}
    assert rec["server"]["tp"] == 8 and rec["server"]["api_key_env"] == "K"
    assert "source" not in rec
    assert cfg.server.extra_args[1] == "sk-live-1"  # the live config is untouched
    assert cfg.cluster.runtime_env["env_vars"]["HF_TOKEN"] == "hf_y"
    plain = parse_config({"server": {"engine": "openai", "base_url": "http://u:pw-2@127.0.0.1:8/v1"},
                          "client": {"endpoints": ["http://u:pw-1@127.0.0.1:9/v1"]}, "data": {"path": "d.jsonl"}})
    rec = plain.recorded()
    assert rec["client"]["endpoints"] == ["http://***@127.0.0.1:9/v1"]
    assert rec["server"]["base_url"] == "http://***@127.0.0.1:8/v1"


# --- refused at load, redacted where shown ------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ["--api-key", "sv-Q1"], ["--api-key=sv-Q1"], ["--admin-api-key", "sv-Q1"], ["--hf-token", "sv-Q1"],
    ["-hft", "sv-Q1"], ["--hf_token=sv-Q1"], ["--password", "sv-Q1"], ["--db-secret", "sv-Q1"],
    ["--aws-credentials", "sv-Q1"], ["--API-KEY", "sv-Q1"],
])
def test_a_secret_flag_in_extra_args_or_command_is_refused_with_the_way_to_pass_it(args):
    for field, extra in (("extra_args", {}), ("command", {"engine": "command", "health_url": "http://x/h"})):
        table = {"engine": "llamacpp", "model": "m.gguf", **extra, field: ["bin", *args] if field == "command" else args}
        with pytest.raises(ConfigError) as exc:
            parse_config({"server": table}, source="job.toml")
        text = str(exc.value)
        assert f"job.toml [server] {field}" in text and args[0].partition("=")[0] in text, text
        assert "api_key_env" in text and "[server.env]" in text, text
        assert "sv-Q1" not in text  # the value itself is never repeated


@pytest.mark.parametrize("args", [["--max-num-batched-tokens", "64"], ["--ssl-keyfile", "k.pem"],
                                  ["--api-key-file", "f"], ["--tokenizer", "t"], ["--kv-cache-dtype", "fp8"]])
def test_flags_that_only_contain_a_secret_word_are_accepted(args):
    assert parse_config({"server": {"engine": "vllm", "model": "m", "extra_args": args}}).server.extra_args == args


@pytest.mark.parametrize("args", [["--host", "0.0.0.0"], ["--host=0.0.0.0"], ["--port", "9"], ["--port=9"]])
def test_host_and_port_in_extra_args_are_refused(args):
    with pytest.raises(ConfigError) as exc:
        parse_config({"server": {"engine": "vllm", "model": "m", "extra_args": args}}, source="job.toml")
    flag = args[0].partition("=")[0]
    assert f"holds {flag}: set [server] {flag[2:]} instead" in str(exc.value)


def test_a_url_password_with_api_key_env_is_one_clear_error_that_hides_the_password():
    for table in ({"server": {"engine": "openai", "base_url": "http://u:pw-9@127.0.0.1:1/v1", "api_key_env": "K"}},
                  {"server": {"engine": "vllm", "model": "m", "api_key_env": "K"},
                   "client": {"endpoints": ["http://u:pw-9@127.0.0.1:2"]}},
                  {"server": {"engine": "openai", "base_url": "http://pw-9@127.0.0.1:1/v1", "api_key_env": "K"}}):
        with pytest.raises(ConfigError) as exc:
            parse_config(table, source="job.toml")
        assert "carries a password" in str(exc.value) and "pw-9" not in str(exc.value)


@pytest.mark.parametrize(("table", "field", "words"), [
    ({"client": {"concurrency": 9223372036854775807}}, "[client] concurrency", "out of range"),
    ({"client": {"concurrency": 10**7}}, "[client] concurrency", "above 1000000"),
    ({"client": {"max_concurrency": 10**7}}, "[client] max_concurrency", "above 1000000"),
    ({"sampling": {"max_tokens": 2**60}}, "[sampling] max_tokens", "out of range"),
    ({"server": {"engine": "vllm", "model": "/m/" + "a" * 300}}, "[server] model", "at most 255 bytes"),
    ({"output": {"dir": "x" * 256}}, "[output] dir", "at most 255 bytes"),
    ({"data": {"path": "d/" * 2100}}, "[data] path", "a path is at most"),
])
def test_extreme_values_end_in_one_clear_error(table, field, words):
    with pytest.raises(ConfigError) as exc:
        parse_config(table, source="job.toml")
    assert f"job.toml {field}" in str(exc.value) and words in str(exc.value), str(exc.value)


def test_redact_doc_hides_url_passwords_in_keys_and_values_and_secret_named_values():
    doc = {"endpoints": {"http://u:pw@h:1": {"running": 1}}, "url": "https://a:b@c/v1",
           "env_vars": {"HF_TOKEN": "hf", "PATH": "/bin"}, "n": 3, "api_key_env": "K"}
    assert redact_doc(doc) == {"endpoints": {"http://***@h:1": {"running": 1}}, "url": "https://***@c/v1",
                               "env_vars": {"HF_TOKEN": "***", "PATH": "/bin"}, "n": 3, "api_key_env": "K"}


def test_echoed_lines_lose_secret_flag_values_and_terminal_controls():
    assert safe_line("argv: ['srv', '--api-key', 'sk-9', '-c', '1']") == "argv: ['srv', '--api-key', '***', '-c', '1']"
    assert safe_line("--hf-token=hf_9 --port 8") == "--hf-token=*** --port 8"
    assert safe_line("HF_TOKEN=hf_9 ok") == "HF_TOKEN=*** ok"
    assert safe_line("max_tokens 12, n_tokens = 4") == "max_tokens 12, n_tokens = 4"
    assert safe_line("said s3cr3t", ["s3cr3t"]) == "said ***"
    assert safe_line("id \x1b[2J\x07 end\r") == "id \\x1b[2J\\x07 end\\x0d"
    assert escape_controls("a\nb\tc") == "a\nb\tc" and escape_controls("a\nb", one_line=True) == "a\\x0ab"


# --- secrets by shape ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "want"), [
    ("http://tok-1@h:8/v1", "http://***@h:8/v1"),
    ("https://u:pw@h/v1", "https://***@h/v1"),
    ("see http://tok-1@h:8 and https://a:b@c/x", "see http://***@h:8 and https://***@c/x"),
    ("http://h:8/v1?api_key=k-1&x=1", "http://h:8/v1?api_key=***&x=1"),
    ("http://h/v1?a=1&ACCESS_TOKEN=k-1", "http://h/v1?a=1&ACCESS_TOKEN=***"),
    ("https://b.s3/o?X-Amz-Date=1&X-Amz-Signature=k-1", "https://b.s3/o?X-Amz-Date=1&X-Amz-Signature=***"),
    ("http://h/?auth=k-1;password=p", "http://h/?auth=***;password=***"),
    ("Authorization: Bearer k-1", "Authorization: Bearer ***"),
    ("authorization: basic dTpw", "authorization: basic ***"),
    ("-H 'Bearer sk-12345678'", "-H 'Bearer ***'"),
    ("A=1 MY_API_KEY=k-1 srv", "A=1 MY_API_KEY=*** srv"),
    ("http://u:p@ss@h:8/v1", "http://***@h:8/v1"),  # an unencoded @ in the password
    ("http://h/v1?api_tokens=k-1&max_tokens=5", "http://h/v1?api_tokens=***&max_tokens=5"),
])
def test_secrets_by_shape_are_hidden_in_text(text, want):
    assert redact_text(text) == want


@pytest.mark.parametrize("text", [
    "user@example.com", "http://h:8/v1?max_tokens=5&n=2", "max_tokens=12", "the bearer of news",
    "Basic usage: harvest run job.toml", "http://h:8/v1/models", "n_tokens = 4",
    "http://h/v1?max_completion_tokens=4&prompt_tokens=2&num-tokens=1", "http://h/v1/a@b",
])
def test_look_alikes_of_secret_shapes_are_kept(text):
    assert redact_text(text) == text


def test_bearer_values_and_secret_assignments_are_hidden_whatever_the_name():
    env = {"AUTH_HEADER": "Bearer k-1", "X": "basic dTpw", "NOTE": "Basic usage here", "P": "http://t@h"}
    assert redact_env(env) == \
        {"AUTH_HEADER": "***", "X": "***", "NOTE": "Basic usage here", "P": "http://***@h"}
    assert redact_argv(["env", "MY_API_KEY=k-1", "AUTH=Bearer k-1", "PATH=/bin", "srv"]) == \
        ("env", "MY_API_KEY=***", "AUTH=***", "PATH=/bin", "srv")
    assert redact_doc({"command": ["env", "HF_TOKEN=k-1"], "h": "Bearer k-1", "u": "http://t@h/?token=k"}) == \
        {"command": ["env", "HF_TOKEN=***"], "h": "***", "u": "http://***@h/?token=***"}


@pytest.mark.parametrize("command", [["env", "MY_API_KEY=sv-Q1", "srv"], ["sh", "-c", "A=1 HF_TOKEN=sv-Q1 srv"],
                                     ["env", "AUTH=Bearer sv-Q1", "srv"]])
def test_a_secret_assignment_in_command_or_extra_args_is_refused_naming_the_variable(command):
    for field, table in (("command", {"engine": "command", "command": command, "health_url": "http://x/h"}),
                         ("extra_args", {"engine": "vllm", "model": "m", "extra_args": command[1:]})):
        with pytest.raises(ConfigError) as exc:
            parse_config({"server": table}, source="job.toml")
        text = str(exc.value)
        assert f"job.toml [server] {field}: `{field}` sets " in text and "[server.env]" in text, text
        assert "sv-Q1" not in text


def test_console_log_records_hide_secrets_by_shape_and_show_controls_escaped():
    import logging

    from harvest.cli.live import ShownFilter

    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "endpoint %s is sick: %s", ("http://tok@h:1",
                               "\x1b]52;c;eA==\x07 Bearer sk-12345678"), None)
    assert ShownFilter().filter(record)
    assert record.getMessage() == "endpoint http://***@h:1 is sick: \\x1b]52;c;eA==\\x07 Bearer ***"


@pytest.mark.parametrize(("key", "secret"), [
    ("authorization", True), ("Proxy-Authorization", True), ("cookie", True), ("x-api-key", True),
    ("api-key", True), ("apiKey", True), ("access_token", True), ("X-Auth-Token", True), ("client_secret", True),
    ("db_password", True), ("HF_TOKEN", True), ("auth", True),
    ("api_key_env", False), ("token_file", False), ("secret_name", False), ("max_tokens", False),
    ("skip_special_tokens", False), ("stop_token_ids", False), ("tokenizer", False), ("top_k", False), ("note", False),
])
def test_header_like_keys_are_secret_and_counts_and_names_are_not(key, secret):
    from harvest.redact import is_secret_key

    assert is_secret_key(key) is secret


def test_header_like_keys_and_values_in_extra_body_are_redacted_and_the_rest_kept():
    body = {"authorization": "Bearer tok-1234567890", "x-api-key": "k-1", "cookie": "session=c-1",
            "note": "Authorization: Basic dXNlcjpwdw==", "raw": '{"X-Api-Key": "k-2", "n": 1}',
            "max_tokens": 5, "skip_special_tokens": False, "chat_template_kwargs": {"enable_thinking": False},
            "api_key_env": "MY_KEY"}
    shown = redact_doc({"sampling": {"extra_body": body}})["sampling"]["extra_body"]
    assert shown == {"authorization": "***", "x-api-key": "***", "cookie": "***",
                     "note": "Authorization: Basic ***", "raw": '{"X-Api-Key": "***", "n": 1}',
                     "max_tokens": 5, "skip_special_tokens": False,
                     "chat_template_kwargs": {"enable_thinking": False}, "api_key_env": "MY_KEY"}
    assert redact_text("Cookie: a=b; c=d\nnext line") == "Cookie: ***\nnext line"
    assert redact_text("Proxy-Authorization: Digest u=1, r=2") == "Proxy-Authorization: Digest ***"


def test_a_resume_names_a_changed_secret_without_either_value(tmp_path):
    from harvest.campaign.run.folder import other_job
    from harvest.ledger import Ledger, hash_settings

    before = {"sampling": {"extra_body": {"authorization": "Bearer old-secret-1"}, "max_tokens": 8}}
    with Ledger.open(tmp_path, settings_hash=hash_settings(before), meta={"output_settings": redact_doc(before)}):
        pass
    assert other_job(tmp_path, before, None) is None  # the same secret: the same job
    now = {"sampling": {"extra_body": {"authorization": "Bearer new-secret-2"}, "max_tokens": 8}}
    why = other_job(tmp_path, now, None)
    assert why is not None and "a value shown as ***" in why
    assert "old-secret-1" not in why and "new-secret-2" not in why
    why = other_job(tmp_path, {"sampling": {**now["sampling"], "max_tokens": 9}}, None)
    assert why is not None and "[sampling] max_tokens: 8 -> 9" in why and "new-secret-2" not in why
