"""Configuration loading: valid files load, and every error names the file, the table and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from harvest.config import Override, load_config, parse_config
from harvest.errors import ConfigError


def write(tmp_path: Path, text: str, name: str = "job.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return info.value


def test_a_valid_file_loads_with_defaults(tmp_path):
    path = write(tmp_path, """
[server]
engine = "sglang"
model = "org/model"
gpus = [0, 1]
tp = 2
mem_fraction_static = 0.85
enable_hierarchical_cache = true
hicache_size = 48

[output]
dir = "runs/a"
""")
    cfg = load_config(path)
    assert cfg.source == str(path)
    server = cfg.require_server()
    assert (server.engine, server.gpus, server.tp, server.host, server.port) == ("sglang", [0, 1], 2, "127.0.0.1", 8000)
    assert server.hicache_size == 48 and server.mem_fraction_static == 0.85
    assert cfg.preflight.memory_margin_mib == 1024
    # Relative paths are relative to the config file's folder, not the working directory.
    assert Path(cfg.output.dir) == tmp_path / "runs" / "a"


def test_out_of_range_value_names_file_table_and_field(tmp_path):
    path = write(tmp_path, '[server]\nengine = "sglang"\nmodel = "m"\nmem_fraction_static = 1.5\n', "sglang.toml")
    err = error_of(path)
    text = str(err)
    assert "sglang.toml" in text and "[server]" in text and "mem_fraction_static" in text
    assert err.source == str(path)
    assert [loc for loc, _ in err.problems] == [f"{path} [server] mem_fraction_static"]


def test_unknown_field_names_its_table(tmp_path):
    err = error_of(write(tmp_path, "[preflight]\nmemory_margin = 3\n"))
    ((loc, msg),) = err.problems
    assert loc.endswith("job.toml [preflight] memory_margin") and msg == "unknown key (did you mean 'memory_margin_mib'?)"


def test_a_misspelled_table_or_key_gets_the_closest_name(tmp_path):
    err = error_of(write(tmp_path, '[clinet]\nconcurrency = 4\n[sampling]\nmax_token = 5\n[output]\nzzz = 1\n'))
    problems = dict(err.problems)
    table = str(tmp_path / "job.toml") + " [clinet]"
    assert problems[table].startswith("unknown table (did you mean 'client'?); tables: server, "), problems
    assert problems[str(tmp_path / "job.toml") + " [sampling] max_token"] == "unknown key (did you mean 'max_tokens'?)"
    assert problems[str(tmp_path / "job.toml") + " [output] zzz"] == "unknown key"  # nothing close: no guess


def test_a_key_in_the_wrong_table_or_by_another_tools_name_gets_harvests_place_for_it(tmp_path):
    """A key of another table names that table; a name vLLM, llama.cpp, OpenAI or Hugging Face
    give a setting (max_new_tokens, tensor_parallel_size, binary) names harvest's key; a [host]
    key is never guessed from the job's own tables' names."""
    err = error_of(write(tmp_path, '[server]\nengine = "vllm"\nmodel = "m"\nmax_tokens = 5\n'
                                   'tensor_parallel_size = 2\nbinary = "x"\n[data]\npath = "p.jsonl"\n'
                                   'prompt_column = "q"\n[sampling]\nmax_new_tokens = 9\nconcurrency = 4\n'
                                   '[[hosts]]\nname = "a"\nssh = "a"\ntimeout = 3\n'))
    at = str(tmp_path / "job.toml")
    problems = dict(err.problems)
    # [host] has timeouts of its own: the closest of its names, never [client]'s request_timeout
    assert problems.pop(f"{at} [hosts] 0.timeout") == "unknown key (did you mean 'connect_timeout'?)", problems
    assert problems == {
        f"{at} [server] max_tokens": "unknown key here: it is a key of [sampling]",
        f"{at} [server] tensor_parallel_size": "unknown key (harvest's name: 'tp')",
        f"{at} [server] binary": "unknown key (harvest's name: 'command')",
        f"{at} [data] prompt_column": "unknown key (harvest's name: 'prompt_field')",
        f"{at} [sampling] max_new_tokens": "unknown key (harvest's name: 'max_tokens')",
        f"{at} [sampling] concurrency": "unknown key here: it is a key of [client]",
    }, err.problems


def test_one_line_per_mistake_and_no_pydantic_prefixes(tmp_path):
    err = error_of(write(tmp_path, '[client]\nconcurrency = "16"\n[server]\nengine = "vllm"\n'))
    lines = str(err).splitlines()[1:]
    assert len(lines) == 2, lines  # the union's two members are one mistake
    concurrency = next(line for line in lines if "concurrency" in line)
    assert concurrency.endswith("[client] concurrency: should be a valid integer or 'auto' (got '16')"), concurrency
    assert "int" not in concurrency.split("concurrency")[0] and "literal" not in concurrency
    server = next(line for line in lines if "[server]" in line)
    assert server.endswith("[server]: engine 'vllm' needs `model`"), server
    assert "Value error" not in str(err)


def test_every_problem_is_reported_not_only_the_first(tmp_path):
    err = error_of(write(tmp_path, """
[server]
engine = "vllm"
model = "m"
gpu_memory_utilization = 0
port = 70000

[server.env]
CUDA_VISIBLE_DEVICES = 0

[sampling]
top_p = 2
"""))
    locs = {loc.split(" ", 1)[1] for loc, _ in err.problems}
    assert locs == {"[server] gpu_memory_utilization", "[server] port", "[server.env] CUDA_VISIBLE_DEVICES",
                    "[sampling] top_p"}


def test_unknown_engine_lists_the_choices(tmp_path):
    err = error_of(write(tmp_path, '[server]\nengine = "tgi"\n'))
    ((loc, msg),) = err.problems
    assert loc.endswith("[server] engine") and "'tgi'" in msg and "sglang" in msg


def test_cross_field_rules_name_the_table_and_the_fields(tmp_path):
    err = error_of(write(tmp_path, '[server]\nengine = "sglang"\nmodel = "m"\ngpus = [0, 1]\ntp = 4\n'))
    ((loc, msg),) = err.problems
    assert loc.endswith("job.toml [server]") and "tp = 4" in msg and "gpus" in msg
    err = error_of(write(tmp_path, '[server]\nengine = "vllm"\nmodel = "m"\nhicache_size = 8\n'))
    assert "hicache_size" in str(err) and "[server]" in str(err) and "SGLang" in str(err)


def test_repeated_gpu_index(tmp_path):
    err = error_of(write(tmp_path, '[server]\nengine = "vllm"\nmodel = "m"\ngpus = [1, 1]\n'))
    ((loc, msg),) = err.problems
    assert loc.endswith("[server] gpus") and "repeat" in msg


def test_toml_syntax_and_unreadable_files_name_the_file(tmp_path):
    err = error_of(write(tmp_path, "[server\n", "broken.toml"))
    assert "broken.toml" in str(err) and "TOML syntax" in str(err) and "line 1" in str(err)
    err = error_of(tmp_path / "missing.toml")
    assert "missing.toml" in str(err) and "cannot read" in str(err)
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(b'[server]\nengine = "caf\xe9"\n')
    assert "not UTF-8" in str(error_of(bad))


def test_a_command_that_needs_server_says_so():
    cfg = parse_config({}, source="empty.toml")
    with pytest.raises(ConfigError) as info:
        cfg.require_server()
    assert "empty.toml [server]" in str(info.value)


def test_cluster_table_loads_and_refuses_bad_values(tmp_path):
    cfg = load_config(write(tmp_path, """
[cluster]
backend = "ray"
address = "ray://head:10001"
servers = "per_node"
gpus_per_server = 2
resources = { engine = 1 }
runtime_env = { env_vars = { A = "1" } }
"""))
    assert cfg.cluster is not None and cfg.cluster.servers == "per_node"
    assert cfg.cluster.bundle() == {"CPU": 1.0, "GPU": 2.0, "engine": 1.0}
    assert cfg.cluster.runtime_env == {"env_vars": {"A": "1"}}
    for bad, where, what in [('servers = 0', "[cluster] servers", ">= 1"),
                             ('servers = "all"', "[cluster] servers", "per_node"),
                             ('backend = "dask"', "[cluster] backend", "ray"),
                             ('resources = { GPU = 1 }', "[cluster] resources", "gpus_per_server"),
                             ('gpus_per_server = -1', "[cluster] gpus_per_server", "0")]:
        text = str(error_of(write(tmp_path, f"[cluster]\n{bad}\n")))
        assert where in text and what in text, text


def test_cluster_with_host_is_refused(tmp_path):
    text = str(error_of(write(tmp_path, '[cluster]\nservers = 2\n[host]\nssh = "a@b"\n')))
    assert "[cluster]" in text and "[host]" in text and "not both" in text


def test_an_endpoints_model_is_a_name_even_where_a_file_of_that_name_exists(tmp_path, monkeypatch):
    # llama-server serves its -m path as the model id ("models/tiny.gguf"): a job against it names
    # that id, and a file of that name beside the job (or in the folder harvest runs in) must not
    # turn it into another name. A launched engine takes the path, resolved.
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny.gguf").write_bytes(b"GGUF")
    monkeypatch.chdir(tmp_path)
    endpoint = '[server]\nengine = "openai"\nbase_url = "http://127.0.0.1:8080/v1"\nmodel = "models/tiny.gguf"\n'
    assert load_config(write(tmp_path, endpoint)).require_server().model == "models/tiny.gguf"
    flags = [Override("--engine", ("server", "engine"), "openai"),
             Override("--base-url", ("server", "base_url"), "http://127.0.0.1:8080/v1"),
             Override("--model", ("server", "model"), "models/tiny.gguf")]
    assert load_config(None, flags).require_server().model == "models/tiny.gguf"
    # --model over a file's launched engine, then --engine openai over it: the engine decides
    launched = write(tmp_path, '[server]\nengine = "llamacpp"\nmodel = "models/tiny.gguf"\n', "l.toml")
    assert load_config(launched).require_server().model == str(tmp_path / "models" / "tiny.gguf")
    switched = load_config(launched, [flags[0], flags[1]]).require_server()
    assert switched.model == "models/tiny.gguf"
    assert load_config(None, [Override("--engine", ("server", "engine"), "llamacpp"),
                              flags[2]]).require_server().model == str(tmp_path / "models" / "tiny.gguf")
