"""``[server]`` (and ``[server.env]``): the engine to launch, or the endpoint to use, with the
settings users tune, and the engine-specific rules those settings answer to (KV dtypes, SGLang's
host pool, reasoning parsers, vLLM's log-probability limit).
"""

from __future__ import annotations

import contextlib
from typing import Any

from pydantic import Field, SecretStr, field_validator, model_validator

from harvest.config.base import (
    LAUNCHED_ENGINES,
    EngineKind,
    StrictModel,
    check_path_text,
    public_host_problem,
    secret_flag_problem,
)
from harvest.redact import redact_server_settings


class ServerConfig(StrictModel):
    """What to launch (or reach) and the settings users tune for throughput."""

    engine: EngineKind = Field(description="what serves the model: harvest launches sglang, vllm, transformers "
                               "(`transformers serve`) or llamacpp (llama-server); openai is an endpoint already "
                               "running; command runs any argv and waits for its health URL")
    model: str | None = Field(None, description="engines harvest launches: the model's folder, a hub name, or for "
                              "llamacpp a GGUF file (a relative path is read from the job file's folder); engine "
                              "openai: the name every request asks for, sent as typed")
    served_model_name: str | None = Field(None, description="the name the engine serves the model under "
                                          "(unset: `model`); requests ask for it")
    host: str = Field("127.0.0.1", description="address the engine binds; a non-loopback one needs `api_key_env`")
    port: int = Field(8000, ge=1, le=65535, description="port the engine listens on; must be free at launch")
    gpus: list[int] = Field(default_factory=list, description="GPU indices the engine may use")
    tp: int = Field(1, ge=1, description="tensor-parallel ranks")
    python: str | None = Field(None, description="Python executable that runs the engine")

    # Settings users tune.
    mem_fraction_static: float | None = Field(None, gt=0, le=1, description="SGLang's share of each GPU's memory "
                                              "for weights and KV cache (--mem-fraction-static)")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="vLLM's share of each GPU's memory "
                                                 "(--gpu-memory-utilization)")
    kv_cache_dtype: str | None = Field(None, description="KV cache type in the engine's own spelling (SGLang "
                                       "fp8_e4m3, vLLM fp8), checked at load; unset: the engine's default")
    enable_hierarchical_cache: bool = Field(False, description="SGLang's host-memory KV tier "
                                            "(--enable-hierarchical-cache)")
    hicache_size: int | None = Field(None, ge=1, description="GB (10^9 bytes) of host RAM per tensor-parallel "
                                     "rank (SGLang's --hicache-size, an int); unset: SGLang sizes the pool")
    hicache_ratio: float | None = Field(None, gt=0, description="host KV pool / device KV pool (SGLang's "
                                        "--hicache-ratio); hicache_size overrides it")
    reasoning_parser: str | None = Field(None, description="--reasoning-parser NAME (SGLang, vLLM): without "
                                         "it, reasoning stays inside the answer text")
    max_running_requests: int | None = Field(None, ge=1, description="the engine's batch limit (SGLang "
                                             "--max-running-requests, vLLM --max-num-seqs, llama.cpp slots)")
    dtype: str | None = Field(None, description="weight dtype passed to the engine (--dtype); unset: its default")
    extra_args: list[str] = Field(default_factory=list, description="more engine flags, as the engine spells "
                                  "them; secret flags and --host/--port are refused (see SECURITY.md)")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment of the engine process "
                                "([server.env]); secret-named values are redacted in every record")

    # Engine `command`: any argv plus a health URL. Engine `openai`: a running endpoint.
    command: list[str] = Field(default_factory=list, description="engine `command`: the argv to run; {host}, "
                               "{port} and {model} are replaced. Engine llamacpp: the llama-server executable "
                               "(unset: llama-server from PATH)")
    health_url: str | None = Field(None, description="engine `command`: the URL that answers 2xx once it is "
                                   "ready ({host} and {port} replaced); unset: the port accepting connections")
    base_url: str | None = Field(None, description="engine `openai`: the running endpoint's base URL "
                                 "(http://host:port or .../v1)")
    api_key_env: str | None = Field(None, description="name of the environment variable holding the API key")

    # Supervision.
    ready_timeout: float = Field(900.0, gt=0, description="seconds to wait for readiness")
    stop_grace: float = Field(10.0, ge=0, description="seconds between SIGTERM and SIGKILL")
    stop_deadline: float = Field(60.0, gt=0, description="seconds a whole stop may take")

    @field_validator("hicache_size", mode="before")
    @classmethod
    def _whole_gb(cls, v: Any) -> Any:
        if isinstance(v, float):
            raise ValueError(f"must be a whole number of GB (got {v:g}): SGLang declares --hicache-size an int")
        if isinstance(v, int) and not isinstance(v, bool) and v < 1:
            raise ValueError(f"must be >= 1 GB (got {v}): to SGLang 0 means automatic sizing (hicache_ratio x "
                             f"the device KV pool); leave hicache_size unset for that")
        return v

    @field_validator("model", "python")
    @classmethod
    def _path_length(cls, v: str | None) -> str | None:
        return check_path_text(v) if v is not None else v

    @field_validator("extra_args", "command")
    @classmethod
    def _no_secret_flags(cls, v: list[str], info: Any) -> list[str]:
        # extra_args go to the engine's own parser, read as it reads them; `command` is the argv
        # of a program harvest does not know (or llama-server's path): read conservatively.
        engine = info.data.get("engine") if info.field_name == "extra_args" else None
        problem = secret_flag_problem(v, info.field_name, engine)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("extra_args")
    @classmethod
    def _no_bind_flags(cls, v: list[str], info: Any) -> list[str]:
        from harvest.engine_flags import argv_problem

        problem = argv_problem(info.data.get("engine"), v, "extra_args", binds=True)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("gpus")
    @classmethod
    def _unique_gpus(cls, v: list[int]) -> list[int]:
        if any(i < 0 for i in v):
            raise ValueError("GPU indices must be >= 0")
        if len(set(v)) != len(v):
            raise ValueError(f"GPU indices repeat: {v}")
        return v

    @field_validator("extra_args", "command")
    @classmethod
    def _no_secret_assignments(cls, v: list[str], info: Any) -> list[str]:
        from harvest.redact import secret_assignment_problem

        problem = secret_assignment_problem(v, info.field_name)
        if problem:
            raise ValueError(problem)
        return v

    @model_validator(mode="after")
    def _engine_needs(self) -> ServerConfig:
        if self.engine == "command" and not self.command:
            raise ValueError("engine 'command' needs `command` (the argv to run)")
        if self.engine == "openai" and not self.base_url:
            raise ValueError("engine 'openai' needs `base_url` (the running endpoint)")
        if self.engine in ("sglang", "vllm", "transformers", "llamacpp") and not self.model:
            raise ValueError(f"engine '{self.engine}' needs `model`")
        _engine_values(self)
        if self.gpus and self.tp > len(self.gpus):
            raise ValueError(f"tp = {self.tp} needs at least {self.tp} GPUs, `gpus` lists {len(self.gpus)}")
        if self.launched:
            problem = public_host_problem(self.host, self.engine, self.api_key_env)
            if problem:
                raise ValueError(problem)
            self._command_hosts()
        return self

    def _command_hosts(self) -> None:
        """A host written into ``command`` (``--host 0.0.0.0``, ``--hos=::``; read conservatively,
        :func:`harvest.engine_flags.read_conservatively`) answers to the rule of ``[server] host``."""
        from harvest.engine_flags import host_values

        for flag, value in host_values(self.command):
            host = value.replace("{host}", self.host)
            read = "" if flag == "--host" else " (read as --host)"
            problem = public_host_problem(host, self.engine, self.api_key_env,
                                          shown=f"`command` holds {flag} {host!r}{read}, and {host!r}")
            if problem:
                raise ValueError(problem)

    @property
    def launched(self) -> bool:
        """True when harvest starts and stops this server itself."""
        return self.engine in LAUNCHED_ENGINES

    @property
    def requested_model(self) -> str | None:
        """The model name every request asks for, checked against ``/v1/models`` at start:
        ``served_model_name``, else for an endpoint harvest does not launch its ``model``. None (a
        launched engine without a served name, which serves ``model`` and nothing else, under a
        name of its own choosing): the first model the server lists."""
        return self.served_model_name or (None if self.launched else self.model)

    @property
    def url(self) -> str:
        """Base URL of the server, without a trailing slash and without ``/v1``."""
        if self.base_url:
            return self.base_url.rstrip("/").removesuffix("/v1")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def api_key(self) -> SecretStr | None:
        """The API key from the environment variable the config names (never from the file)."""
        import os

        if not self.api_key_env:
            return None
        value = os.environ.get(self.api_key_env)
        return SecretStr(value) if value else None

    def recorded(self, exclude: set[str] | None = None) -> dict[str, Any]:
        """The ``[server]`` table as JSON, fit to write down: literal keys in ``extra_args`` or
        ``command``, secret-named ``[server.env]`` variables and the ``api_key_env`` value redacted."""
        from harvest.redact import redact_doc

        key = self.api_key()
        secrets = [key.get_secret_value()] if key is not None else []
        # then URL passwords (base_url, health_url) anywhere in the table
        return redact_doc(redact_server_settings(self.model_dump(mode="json", exclude=exclude), secrets), secrets)


def _engine_values(server: ServerConfig) -> None:
    """Engine-specific values, checked against the engine's own accepted set (harvest.engine_pins)."""
    from harvest.engine_pins import KV_DTYPES, REASONING_PARSER_ENGINES

    dtype = server.kv_cache_dtype
    if dtype is not None and server.engine in KV_DTYPES:
        name, accepted = KV_DTYPES[server.engine]
        if dtype not in accepted:
            hint = {("sglang", "fp8"): " (vLLM's fp8 is fp8_e4m3)", ("vllm", "bf16"): " (vLLM spells it bfloat16)",
                    }.get((server.engine, dtype), "")
            if server.engine == "llamacpp" and dtype.startswith("fp8"):
                hint = " (llama.cpp has no FP8 cache type)"
            article = "an" if name == "SGLang" else "a"
            raise ValueError(f"`kv_cache_dtype`: {dtype} is not {article} {name} KV dtype{hint}; {name} accepts "
                             f"{', '.join(accepted)}")
    if server.engine != "sglang":
        for field in ("hicache_size", "hicache_ratio"):
            if getattr(server, field) is not None:
                raise ValueError(f"`{field}` is an SGLang setting; engine '{server.engine}' has no host KV pool")
    if server.reasoning_parser is not None:
        if server.engine not in REASONING_PARSER_ENGINES:
            raise ValueError(f"`reasoning_parser`: engine '{server.engine}' takes no --reasoning-parser "
                             f"(only {' and '.join(REASONING_PARSER_ENGINES)})")
        if not server.reasoning_parser.strip() or server.reasoning_parser.strip() != server.reasoning_parser \
                or server.reasoning_parser.startswith("-"):
            raise ValueError(f"`reasoning_parser`: {server.reasoning_parser!r} is not a parser name")


#: vLLM's default ``--max-logprobs``: top-k log-probabilities per token it returns at most.
VLLM_MAX_LOGPROBS = 20


def engine_logprobs_limit(server: ServerConfig | None) -> tuple[int, str] | None:
    """The most top-k log-probabilities per token the job's engine returns, and where that limit
    comes from; None when harvest knows of no limit (SGLang, llama-server, an unknown endpoint)."""
    if server is None or server.engine != "vllm":
        return None
    from harvest.engine_flags import readings

    args = list(server.extra_args)
    for i, reading in reversed(readings("vllm", args)):  # the last one wins, as in vLLM's parser
        if reading.candidates != ("--max-logprobs",):  # in any spelling vLLM reads as it (--max-logp)
            continue
        value = reading.inline_value if reading.inline_value is not None else (
            args[i + 1] if i + 1 < len(args) else None)
        if value is not None:
            with contextlib.suppress(ValueError):
                return int(value), f"vLLM allows: its max_logprobs is {int(value)} ([server] extra_args --max-logprobs)"
    return VLLM_MAX_LOGPROBS, (f"vLLM allows: its max_logprobs is {VLLM_MAX_LOGPROBS} by default "
                               "(raise it with --max-logprobs N in [server] extra_args)")


__all__ = ["ServerConfig", "VLLM_MAX_LOGPROBS", "engine_logprobs_limit"]
