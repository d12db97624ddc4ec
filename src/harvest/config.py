"""The one typed configuration of harvest, loaded from TOML.

A file holds any of these tables; each command reads the ones it needs:

    [server]      the engine to launch (or the endpoint to use) and the settings users tune
    [server.env]  extra environment variables for the engine process
    [preflight]   margins and thresholds of the launch-safety rules
    [data]        the input dataset and how its fields map to prompts
    [sampling]    generation parameters
    [client]      concurrency, timeouts, retries, extra endpoints
    [output]      the run folder
    [host]        the box (over SSH, and/or inside a container) where the server runs; absent: here
    [[hosts]]     several such boxes, one server each, driven as one campaign
    [cluster]     a Ray cluster: servers placed as Ray actors, one supervised server each

Validation errors name the file, the table and the field. This module never touches the machine:
no probing, no folders created; relative paths are resolved against the config file's folder.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from harvest.errors import ConfigError
from harvest.redact import redact_server_settings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

EngineKind = Literal["sglang", "vllm", "transformers", "llamacpp", "openai", "command"]

#: Engines harvest starts and stops itself (``openai`` is an endpoint that is already running).
LAUNCHED_ENGINES = ("sglang", "vllm", "transformers", "llamacpp", "command")
#: Launched engines that cannot be given an API key (so are never bound to a public address).
KEYLESS_ENGINES = ("transformers",)


#: Largest integer any setting takes (exact in JSON and in a float, and far below SQLite's limit).
MAX_INT = 2**53 - 1
#: Largest ``concurrency`` / ``max_concurrency``: requests in flight, all endpoints together.
MAX_CONCURRENCY = 1_000_000
#: Longest file name one path component may have (Linux NAME_MAX, bytes), and longest path (PATH_MAX).
NAME_MAX, PATH_MAX = 255, 4096


def check_path_text(value: str) -> str:
    """A path the system can open: no component over 255 bytes, the whole under 4096."""
    if len(value.encode("utf-8", "surrogateescape")) >= PATH_MAX:
        raise ValueError(f"is {len(value.encode())} bytes long; a path is at most {PATH_MAX - 1} bytes")
    for part in value.split("/"):
        n = len(part.encode("utf-8", "surrogateescape"))
        if n > NAME_MAX:
            raise ValueError(f"has a name of {n} bytes ({part[:24]}...); a file name is at most {NAME_MAX} bytes")
    return value


def secret_flag_problem(argv: list[str], field: str, engine: str | None = None) -> str | None:
    """Why ``argv`` may not hold a secret-looking flag (see :data:`harvest.redact.SECRET_FLAG`),
    in any spelling ``engine``'s parser reads as one (:mod:`harvest.engine_flags`; without a known
    engine, conservatively): every user on the machine reads a process's argv in /proc/PID/cmdline."""
    from harvest.engine_flags import argv_problem

    return argv_problem(engine, argv, field, binds=False)


def public_host_problem(host: str, engine: str, api_key_env: str | None, shown: str | None = None) -> str | None:
    """Why serving on ``host`` is refused (``shown`` says where the address was written, default
    ``host = '...'``): a non-loopback address needs an API key (``api_key_env``), and an engine that
    takes no key never gets one. None: allowed."""
    if is_loopback(host):
        return None
    where = shown or f"host = {host!r}"
    if engine in KEYLESS_ENGINES:
        return (f"{where} is not a loopback address, and engine '{engine}' takes no API key: "
                f"bind it to a loopback address (e.g. 127.0.0.1)")
    if not api_key_env:
        return (f"{where} is not a loopback address: serving it needs an API key (set "
                f"`api_key_env` to the environment variable holding it), or bind a loopback address "
                f"(e.g. 127.0.0.1)")
    return None


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` exposes the server to this machine only (no name resolution: any
    host name other than ``localhost`` counts as public, and so do ``0.0.0.0``, ``::`` and "")."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class _Model(BaseModel):
    # strict: a value of the wrong TOML type is an error, never coerced (`port = true` is not port
    # 1, `flag = "yes"` is not true); an integer still fills a float. No inf/nan: every timeout and
    # fraction is a finite number.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        # A NUL cannot be part of a path, an argv element or an environment variable.
        if _has_nul(value):
            raise ValueError("contains a NUL character (\\u0000)")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
            raise ValueError(f"{value} is out of range (at most {MAX_INT}, 2**53 - 1)")
        return value


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, (list, tuple)):
        return any(_has_nul(v) for v in value)
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    return False


class ServerConfig(_Model):
    """What to launch (or reach) and the settings users tune for throughput."""

    engine: EngineKind = Field(description="what serves the model: harvest launches sglang, vllm, transformers "
                               "(`transformers serve`) or llamacpp (llama-server); openai is an endpoint already "
                               "running; command runs any argv and waits for its health URL")
    model: str | None = Field(None, description="model folder or hub name; served model name")
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
    command: list[str] = Field(default_factory=list, description="engine `command`: the argv to run (e.g. a "
                               "llama-server binary and its flags); {host}, {port} and {model} are replaced")
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


class PreflightConfig(_Model):
    """Margins of the launch-safety rules."""

    memory_margin_mib: int = Field(1024, ge=0, description="free MiB required beyond the engine's claim")
    ram_reserve_gib: float = Field(8.0, ge=0, description="host RAM kept free beyond vLLM CPU's "
                                   "VLLM_CPU_KVCACHE_SPACE (SGLang's host pool keeps SGLang's own 10 GiB)")
    max_swap_used_mib: int = Field(1024, ge=0, description="swap in use above which a launch is refused (MiB)")
    min_disk_free_gib: float = Field(10.0, ge=0, description="free disk required in the run folder's "
                                     "file system (GiB)")
    default_claim_fraction: float = Field(0.9, gt=0, le=1, description="share of each GPU's memory an engine "
                                          "without a fraction setting is taken to claim")


class DataConfig(_Model):
    """The input dataset and its field mapping."""

    path: str = Field(description="the dataset: JSONL, a JSON array, Parquet, CSV, or a `save_to_disk` folder")
    format: Literal["auto", "jsonl", "json", "parquet", "csv", "hf"] = Field(
        "auto", description="the file format; auto: from the name (a folder is `hf`)")
    shape: Literal["auto", "prompt", "messages", "sharegpt", "specforge"] = Field(
        "auto", description="a prompt field, OpenAI `messages`, or ShareGPT / SpecForge `conversations`; "
        "auto: detected per row")
    id_field: str | None = Field(None, description="the rows' id field, kept in the export; unset: a field "
                                 "named `id` where a row has one, else a content hash; \"\": always the hash")
    prompt_field: str = Field("prompt", description="the prompt's field (shape `prompt`)")
    messages_field: str = Field("messages", description="the OpenAI messages' field (shape `messages`)")
    conversations_field: str = Field("conversations", description="the conversation's field (ShareGPT, SpecForge)")
    system_prompt: str | None = Field(None, description="a system message put before rows that have none")
    limit: int | None = Field(None, ge=1, description="read at most this many rows")
    max_prompt_tokens: int | None = Field(None, ge=1, description="skip (never send) prompts with more tokens; "
                                          "the model's context, learned from the server, always applies")
    max_skipped_share: float = Field(0.5, ge=0, le=1, description="a run ending with more than this share of "
                                     "its rows skipped exits 1 (every row skipped always does)")

    @field_validator("path")
    @classmethod
    def _path_length(cls, v: str) -> str:
        return check_path_text(v)


class SamplingConfig(_Model):
    """Generation parameters sent with every request."""

    max_tokens: int = Field(512, ge=1, description="tokens generated per answer at most; an answer cut there "
                            "is `truncated`, never `done`")
    temperature: float = Field(0.0, ge=0, description="sampling temperature (0: greedy)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass")
    top_k: int | None = Field(None, description="top-k sampling; unset: not sent")
    seed: int | None = Field(None, description="sampling seed; sample k of an item asks seed + k")
    stop: list[str] = Field(default_factory=list, description="stop strings")
    extra_body: dict[str, Any] = Field(default_factory=dict, description="more fields merged into every "
                                       "request's JSON body")
    n: int = Field(1, ge=1, le=1024, description="samples per item, each its own result with its index "
                   "(0..n-1), committed exactly once")
    logprobs: int = Field(0, ge=0, description="top-k log-probabilities stored per generated token beside "
                          "the ledger (0: none)")
    n_per_request: bool | None = Field(None, description="the n samples as one request with `n`; unset: true "
                                       "for vLLM and SGLang, false (n seeded requests) for llama-server and "
                                       "endpoints of unknown kind")

    def one_request(self, engine: str | None) -> bool:
        """Whether the samples of an item go out as one request with ``n`` (see ``n_per_request``)."""
        if self.n_per_request is not None:
            return self.n_per_request
        return engine in ("vllm", "sglang")


class ClientConfig(_Model):
    """How the client talks to the server(s)."""

    concurrency: int | Literal["auto"] = Field("auto", description="requests in flight, all endpoints together. "
                                               "auto: a controller per endpoint steers by the engine's gauges "
                                               "(running, waiting, KV use) and token counter, or a canary "
                                               "request without /metrics, from `auto_start` up to "
                                               "`max_concurrency` (harvest.client.autoconc). A number fixes it")
    max_concurrency: int = Field(1024, ge=1, description="upper bound per endpoint of concurrency = \"auto\"")
    auto_start: int | None = Field(None, ge=1, description="where concurrency = \"auto\" starts; unset: the "
                                   "batch limit of the engine harvest launched (half of it without /metrics), "
                                   "else 64")
    request_timeout: float = Field(600.0, gt=0, description="seconds one request may take")
    max_retries: int = Field(3, ge=0, description="attempts charged to an item beyond its first before it "
                             "fails; a sick or dead server holds requests instead of charging them")
    endpoints: list[str] = Field(default_factory=list, description="extra base URLs served by the same model")
    health_deadline: float = Field(600.0, gt=0, description="seconds a sick server may take to recover")
    start_deadline: float = Field(60.0, gt=0, description="seconds an endpoint harvest does not manage may take "
                                  "to answer when the run starts; past it the run ends, items left pending")
    prefix_affinity: bool = Field(True, description="with several endpoints, an item's turns and a shared "
                                  "system prompt go to the server likely holding that prefix (load bounded at "
                                  "1.25 x the average); false: least outstanding")

    @field_validator("concurrency")
    @classmethod
    def _concurrency(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError('must be >= 1 or "auto"')
        if isinstance(value, int) and value > MAX_CONCURRENCY:
            raise ValueError(f'{value} is above {MAX_CONCURRENCY} requests in flight; set a real number or "auto"')
        return value

    @field_validator("max_concurrency", "auto_start")
    @classmethod
    def _concurrency_bound(cls, value: int | None) -> int | None:
        if value is not None and value > MAX_CONCURRENCY:
            raise ValueError(f"{value} is above {MAX_CONCURRENCY} requests in flight")
        return value

    @model_validator(mode="after")
    def _auto_bounds(self) -> ClientConfig:
        if self.auto_start is not None and self.auto_start > self.max_concurrency:
            raise ValueError(f"auto_start {self.auto_start} is above max_concurrency {self.max_concurrency}")
        return self

    @property
    def auto(self) -> bool:
        """True for ``concurrency = "auto"``."""
        return self.concurrency == "auto"

    def fixed_or_max(self) -> int:
        """The fixed concurrency, or ``max_concurrency`` per endpoint bound for "auto"."""
        return self.max_concurrency if self.concurrency == "auto" else int(self.concurrency)


class RunConfig(_Model):
    """How the campaign treats conversations, reasoning and truncated answers."""

    history: Literal["regenerated", "original"] = Field("regenerated", description="context of assistant turn "
                                                         "k: the regenerated turns 0..k-1, or the input's own")
    reasoning: Literal["none", "save", "strip"] = Field("save", description="reasoning (reasoning_content or a "
                                                         "<think> block): left in the answer (none), kept apart "
                                                         "(save), or removed (strip)")
    truncated: Literal["keep", "retry", "drop"] = Field("keep", description="an answer cut by max_tokens: kept as "
                                                         "`truncated`, retried once with retry_max_tokens, or "
                                                         "dropped (failed, class \"truncated\")")
    retry_max_tokens: int | None = Field(None, ge=1, description="max_tokens of the retry (default 2x)")
    progress_interval: float = Field(5.0, gt=0, description="seconds between progress updates (display and "
                                     "progress.json)")
    max_relaunches: int = Field(5, ge=0, description="times a managed server that died is relaunched in one run")
    breaker_window: int = Field(20, ge=0, description="requests in a row failing the same way (HTTP "
                                "400/401/403/404/422, context overflow) that stop the run, items left "
                                "pending; 0: off")
    empty_retries: int = Field(1, ge=0, description="times an empty answer is asked again before the item "
                               "fails with class \"empty\"")
    prefix_order: bool = Field(True, description="claimed items sharing a prompt prefix are sent together so "
                               "the engine's prompt cache serves them; false: claim order")


class OutputConfig(_Model):
    """Where the run folder lives."""

    dir: str = Field("harvest-run", description="the run folder: ledger, records, server log, exports")

    @field_validator("dir")
    @classmethod
    def _path_length(cls, v: str) -> str:
        return check_path_text(v)


class HostConfig(_Model):
    """Where the server runs: a box reached over SSH (``ssh``) and/or a container entered with an
    exec prefix. The far side runs harvest's own JSON commands; see :mod:`harvest.placement.ssh`."""

    ssh: str | None = Field(None, description="`user@name` or a name from ~/.ssh/config; unset: this machine "
                            "(with `exec_prefix` only)")
    port: int = Field(22, ge=1, le=65535, description="the SSH port")
    identity_file: str | None = Field(None, description="the SSH key file (ssh -i)")
    ssh_options: list[str] = Field(default_factory=list, description="more `-o` options for OpenSSH's client, "
                                   "each `Key=Value` (they win over harvest's own)")
    exec_prefix: list[str] = Field(default_factory=list, description="argv run before every far command, e.g. "
                                   "[\"pct\", \"exec\", \"101\", \"--\"]")
    harvest: str = Field("harvest", description="the harvest executable on the far side (after the prefix)")
    forward_to: str = Field("127.0.0.1", description="the address the data tunnel forwards to on the far side "
                            "(a container's own address)")
    connect_timeout: float = Field(10.0, gt=0, description="seconds to establish the SSH connection (TCP, "
                                   "banner, key exchange)")
    command_timeout: float = Field(120.0, gt=0, description="seconds one far command may take beyond the "
                                   "connection (a launch adds its ready_timeout)")
    name: str | None = Field(None, description="a label for tables and messages (default: `ssh` or `local`)")
    server: dict[str, Any] = Field(default_factory=dict, description="fields of [server] that differ on this "
                                   "host (`port`, a far `model` path, `command`...)")

    def server_config(self, base: ServerConfig) -> ServerConfig:
        """``base`` with this host's overrides; a bad override is a ConfigError naming the host."""
        if not self.server:
            return base
        try:
            return ServerConfig.model_validate({**base.model_dump(), **self.server})
        except ValidationError as exc:
            where = f"[host {self.label}] server"
            raise ConfigError(where, [(f"{where}.{'.'.join(str(p) for p in _field_path(tuple(e['loc'])))}",
                                       e["msg"].removeprefix("Value error, ")) for e in exc.errors()]) from None

    @field_validator("ssh_options")
    @classmethod
    def _key_value(cls, v: list[str]) -> list[str]:
        for opt in v:
            if "=" not in opt or opt.startswith("-"):
                raise ValueError(f"{opt!r}: each SSH option is Key=Value (passed as -o Key=Value)")
        return v

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        if self.ssh is None:
            return "local" + (f" ({self.exec_prefix[0]})" if self.exec_prefix else "")
        return self.ssh + (f":{self.port}" if self.port != 22 else "")


class ClusterConfig(_Model):
    """A Ray cluster the servers run on (see :mod:`harvest.placement.ray.servers`); needs the ray extra."""

    backend: Literal["ray"] = Field("ray", description="the cluster kind (Ray only)")
    address: str = Field("auto", description="auto (the cluster this machine belongs to, `ray start`), "
                         "HOST:PORT or ray://HEAD:10001")
    servers: int | Literal["per_node"] = Field(1, description="servers to place, or \"per_node\": one on each "
                                               "node with room for one")
    gpus_per_server: int = Field(1, ge=0, description="GPUs of each server (its tensor-parallel ranks), from "
                                 "Ray's assignment; 0 for CPU engines")
    resources: dict[str, float] = Field(default_factory=dict, description="custom Ray resources each server's "
                                        "bundle asks for besides one CPU and its GPUs")
    runtime_env: dict[str, Any] = Field(default_factory=dict, description="Ray runtime_env of the servers' "
                                        "actors (env_vars, py_modules...): harvest must be importable on "
                                        "every node, the same version as here")
    namespace: str = Field("harvest", description="Ray namespace of the servers' named actors and placement "
                           "groups")
    connect_timeout: float = Field(60.0, gt=0, description="seconds to connect to the cluster and to wait for "
                                   "a placement")

    @field_validator("servers")
    @classmethod
    def _servers(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError('must be >= 1 or "per_node"')
        return v

    @field_validator("resources")
    @classmethod
    def _resources(cls, v: dict[str, float]) -> dict[str, float]:
        for name, amount in v.items():
            if name in ("CPU", "GPU", "memory", "object_store_memory"):
                raise ValueError(f"{name!r} is a Ray default resource: set gpus_per_server instead")
            if amount <= 0:
                raise ValueError(f"{name} = {amount:g}: an amount must be > 0")
        return v

    def bundle(self) -> dict[str, float]:
        """The one bundle of a server's placement group."""
        out: dict[str, float] = {"CPU": 1.0}
        if self.gpus_per_server:
            out["GPU"] = float(self.gpus_per_server)
        out.update({k: float(v) for k, v in self.resources.items()})
        return out


class HarvestConfig(_Model):
    """A whole harvest configuration file. Every table is optional; commands say which they need."""

    server: ServerConfig | None = None
    preflight: PreflightConfig = Field(default_factory=PreflightConfig)
    data: DataConfig | None = None
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    client: ClientConfig = Field(default_factory=ClientConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    host: HostConfig | None = None
    hosts: list[HostConfig] = Field(default_factory=list)
    cluster: ClusterConfig | None = None
    #: The file this configuration came from (not a TOML field).
    source: str = Field("<memory>", exclude=True)

    def recorded(self) -> dict[str, Any]:
        """The configuration as JSON, fit to write down: secrets in ``[server]``, URL passwords
        and secret-named variables (``[cluster] runtime_env.env_vars``) redacted."""
        from harvest.redact import redact_doc

        data = self.model_dump(mode="json", exclude={"source"})
        if self.server is not None:
            data["server"] = self.server.recorded()
        for table in ("client", "cluster", "host", "hosts"):  # endpoint URLs, runtime_env env_vars
            if data.get(table) is not None:
                data[table] = redact_doc(data[table])
        return data

    @model_validator(mode="after")
    def _one_credential(self) -> HarvestConfig:
        from harvest.redact import URL_USER, redact_text

        if self.server is not None and self.server.api_key_env:
            for url in [self.server.base_url or "", *self.client.endpoints]:
                if URL_USER.search(url):  # a user part, with or without a password: basic auth
                    raise ValueError(f"{redact_text(url)} carries a password (a user part) and [server] "
                                     f"api_key_env names a key: give one credential (the key, through api_key_env)")
        return self

    @model_validator(mode="after")
    def _one_host_form(self) -> HarvestConfig:
        if self.host is not None and self.hosts:
            raise ValueError("use either [host] or [[hosts]], not both")
        if self.cluster is not None and (self.host is not None or self.hosts):
            raise ValueError("use either [cluster] or [host] / [[hosts]], not both: on a Ray cluster "
                             "Ray places the servers")
        return self

    @model_validator(mode="after")
    def _logprobs_within_engine(self) -> HarvestConfig:
        limit = engine_logprobs_limit(self.server)
        if limit is not None and self.sampling.logprobs > limit[0]:
            raise ValueError(f"[sampling] logprobs = {self.sampling.logprobs} is above what {limit[1]}")
        return self

    def far_hosts(self) -> list[HostConfig]:
        """The hosts the server runs on: [[hosts]], else [host], else none (this machine)."""
        return list(self.hosts) if self.hosts else ([self.host] if self.host is not None else [])

    def require_server(self) -> ServerConfig:
        if self.server is None:
            raise ConfigError(self.source, [(f"{self.source} [server]", "this command needs a [server] table")])
        return self.server


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


def _location(source: str, loc: tuple[Any, ...]) -> str:
    """Render a pydantic error location as ``file [table] field``."""
    parts = [str(p) for p in loc]
    tables: list[str] = []
    while parts and parts[0] in HarvestConfig.model_fields and parts[0] != "source":
        tables.append(parts.pop(0))
        if tables[-1] == "server" and parts and parts[0] == "env":
            tables.append(parts.pop(0))
        break
    table = f" [{'.'.join(tables)}]" if tables else ""
    field = " " + ".".join(parts) if parts else ""
    return f"{source}{table}{field}"


def _resolve_paths(data: dict[str, Any], base: Path) -> None:
    """Make relative file paths in the raw TOML relative to the config file's folder."""

    def rel(value: str) -> str:
        p = Path(value).expanduser()
        if p.is_absolute():
            return str(p)
        candidate = base / p
        return str(candidate) if (candidate.exists() or value.startswith(".")) else value

    server = data.get("server")
    if isinstance(server, dict):
        for key in ("model", "python"):
            if isinstance(server.get(key), str):
                server[key] = rel(server[key])
    def key_file(h: Any) -> Any:  # the key file is on this machine: relative to the config file
        if isinstance(h, dict) and isinstance(h.get("identity_file"), str):
            return {**h, "identity_file": str(base / Path(h["identity_file"]).expanduser())}
        return h

    if "host" in data:
        data["host"] = key_file(data["host"])
    if isinstance(data.get("hosts"), list):
        data["hosts"] = [key_file(h) for h in data["hosts"]]
    for table, key in (("data", "path"), ("output", "dir")):
        section = data.get(table)
        if isinstance(section, dict) and isinstance(section.get(key), str):
            p = Path(section[key]).expanduser()
            section[key] = str(p if p.is_absolute() else base / p)


def parse_config(data: dict[str, Any], source: str = "<memory>", base: Path | None = None) -> HarvestConfig:
    """Validate an already-parsed mapping. Raises :class:`ConfigError` naming table and field."""
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    if base is not None:
        _resolve_paths(data, base)
    try:
        return HarvestConfig.model_validate({**data, "source": source})
    except ValidationError as exc:
        raise ConfigError(source, _problems(source, exc.errors())) from None


#: The model of each table, for "did you mean" (``hosts`` is an array of [host] tables).
_TABLES: dict[str, type[BaseModel]] = {
    "server": ServerConfig, "preflight": PreflightConfig, "data": DataConfig, "sampling": SamplingConfig,
    "client": ClientConfig, "output": OutputConfig, "run": RunConfig, "host": HostConfig, "hosts": HostConfig,
    "cluster": ClusterConfig,
}
#: pydantic's own prefixes of a validator's message, which say nothing to a person.
_PREFIXES = ("Value error, ", "Assertion failed, ")


def _field_path(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """``loc`` without pydantic's tags of union members and validators (``int``, ``literal['auto']``,
    ``function-after[...]``): what is left names the table and the key."""
    tags = {"int", "float", "str", "bool", "list", "dict", "none", "json-or-python"}
    return tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p in tags)))


def _did_you_mean(name: str, choices: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _unknown(loc: tuple[Any, ...]) -> tuple[str | None, str]:
    """The message of an unknown table or key, with the closest known name; the location to show
    (None: the usual one)."""
    name = str(loc[-1])
    if len(loc) == 1:  # a top-level name: a table
        tables = [t for t in HarvestConfig.model_fields if t != "source"]
        return f"[{name}]", f"unknown table{_did_you_mean(name, tables)}; tables: {', '.join(tables)}"
    model = _TABLES.get(str(loc[0]))
    keys = list(model.model_fields) if model is not None and not (loc[0] == "server" and loc[1:2] == ("env",)) else []
    return None, "unknown key" + _did_you_mean(name, keys)


def _problems(source: str, errors: list[Any]) -> list[tuple[str, str]]:
    """One ``(location, message)`` per mistake: the errors of a union's members are one mistake."""
    merged: dict[tuple[Any, ...], list[Any]] = {}
    for err in errors:
        merged.setdefault(_field_path(tuple(err["loc"])), []).append(err)
    problems = []
    for loc, errs in merged.items():
        where = _location(source, loc)
        if errs[0]["type"] == "extra_forbidden":
            shown, msg = _unknown(loc)
            if shown is not None:
                where = f"{source} {shown}"
        elif len(errs) > 1:  # a value of none of the union's types: one line, every accepted form
            forms = [e["msg"].removeprefix("Input should be ") for e in errs]
            msg = f"should be {' or '.join(forms)} (got {errs[0].get('input')!r})"
        else:
            err = errs[0]
            msg = err["msg"]
            for prefix in _PREFIXES:
                msg = msg.removeprefix(prefix)
            if err["type"] in ("literal_error", "int_type", "float_type", "string_type", "bool_type",
                               "int_from_float", "list_type", "dict_type"):
                msg = f"{msg} (got {err.get('input')!r})"
        problems.append((where, msg))
    return problems


def load_config(path: str | Path) -> HarvestConfig:
    """Read and validate a TOML configuration file."""
    path = Path(path)
    source = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(source, [(source, f"cannot read: {exc.strerror or exc}")]) from None
    try:
        data = tomllib.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise ConfigError(source, [(source, f"not UTF-8 text (byte {exc.start})")]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, [(source, f"TOML syntax: {exc}")]) from None
    except RecursionError:
        raise ConfigError(source, [(source, "TOML nested too deeply")]) from None
    return parse_config(data, source=source, base=path.resolve().parent)


__all__ = [
    "ClientConfig",
    "ClusterConfig",
    "DataConfig",
    "EngineKind",
    "HarvestConfig",
    "KEYLESS_ENGINES",
    "LAUNCHED_ENGINES",
    "OutputConfig",
    "PreflightConfig",
    "RunConfig",
    "SamplingConfig",
    "VLLM_MAX_LOGPROBS",
    "engine_logprobs_limit",
    "ServerConfig",
    "is_loopback",
    "load_config",
    "public_host_problem",
    "parse_config",
]
