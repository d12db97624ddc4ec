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


def secret_flag_problem(argv: list[str], field: str) -> str | None:
    """Why ``argv`` may not hold a secret-looking flag (see :data:`harvest.redact.SECRET_FLAG`):
    every user on the machine reads a process's argv in /proc/PID/cmdline."""
    from harvest.redact import SECRET_FLAG

    for arg in argv:
        flag = arg.partition("=")[0]
        if SECRET_FLAG.match(flag):
            return (f"`{field}` holds {flag}: every user of this machine can read a server's command line "
                    f"(/proc/PID/cmdline). Pass an API key with `api_key_env` (the name of an environment "
                    f"variable holding it), and other secrets as environment variables in [server.env] "
                    f"(e.g. HF_TOKEN)")
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

    engine: EngineKind
    model: str | None = Field(None, description="model folder or hub name; served model name")
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    gpus: list[int] = Field(default_factory=list, description="GPU indices the engine may use")
    tp: int = Field(1, ge=1, description="tensor-parallel ranks")
    python: str | None = Field(None, description="Python executable that runs the engine")

    # Settings users tune.
    mem_fraction_static: float | None = Field(None, gt=0, le=1)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    kv_cache_dtype: str | None = None
    enable_hierarchical_cache: bool = False
    hicache_size: int | None = Field(None, ge=1, description="GB (10^9 bytes) of host RAM per tensor-parallel "
                                     "rank (SGLang's --hicache-size, an int); unset: SGLang sizes the pool")
    hicache_ratio: float | None = Field(None, gt=0, description="host KV pool / device KV pool (SGLang's "
                                        "--hicache-ratio); hicache_size overrides it")
    reasoning_parser: str | None = Field(None, description="--reasoning-parser NAME (SGLang, vLLM): without "
                                         "it, reasoning stays inside the answer text")
    max_running_requests: int | None = Field(None, ge=1)
    dtype: str | None = None
    extra_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    # Engine `command`: any argv plus a health URL. Engine `openai`: a running endpoint.
    command: list[str] = Field(default_factory=list)
    health_url: str | None = None
    base_url: str | None = None
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
        problem = secret_flag_problem(v, info.field_name)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("extra_args")
    @classmethod
    def _no_bind_flags(cls, v: list[str]) -> list[str]:
        for arg in v:
            flag = arg.partition("=")[0]
            if flag in ("--host", "--port"):
                raise ValueError(f"`extra_args` holds {flag}: set [server] {flag[2:]} instead (harvest checks "
                                 f"the address there: a non-loopback host needs `api_key_env`)")
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
        if self.launched and not is_loopback(self.host):
            if self.engine in KEYLESS_ENGINES:
                raise ValueError(f"host = {self.host!r} is not a loopback address, and engine "
                                 f"'{self.engine}' takes no API key: bind it to a loopback address "
                                 f"(e.g. 127.0.0.1)")
            if not self.api_key_env:
                raise ValueError(f"host = {self.host!r} is not a loopback address: serving it needs an API "
                                 f"key (set `api_key_env` to the environment variable holding it), or bind "
                                 f"a loopback address (e.g. 127.0.0.1)")
        return self

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
    max_swap_used_mib: int = Field(1024, ge=0)
    min_disk_free_gib: float = Field(10.0, ge=0)
    #: How much GPU memory an engine without a fraction setting claims (fraction of total).
    default_claim_fraction: float = Field(0.9, gt=0, le=1)


class DataConfig(_Model):
    """The input dataset and its field mapping."""

    path: str
    format: Literal["auto", "jsonl", "json", "parquet", "csv", "hf"] = "auto"
    shape: Literal["auto", "prompt", "messages", "sharegpt", "specforge"] = "auto"
    #: The row's id field. Not set: a field named ``id`` where a row has one, else a content
    #: hash; ``""``: always a content hash.
    id_field: str | None = None
    prompt_field: str = "prompt"
    messages_field: str = "messages"
    conversations_field: str = "conversations"
    system_prompt: str | None = None
    limit: int | None = Field(None, ge=1)
    #: Items whose prompt has more tokens are skipped, never sent (besides the model's own context,
    #: which is learned from the server; see campaign/context.py).
    max_prompt_tokens: int | None = Field(None, ge=1)
    #: A run that ends with more than this share of its unique input rows skipped exits non-zero
    #: (1: never; every row skipped always does). The skipped rows stay in the ledger.
    max_skipped_share: float = Field(0.5, ge=0, le=1)

    @field_validator("path")
    @classmethod
    def _path_length(cls, v: str) -> str:
        return check_path_text(v)


class SamplingConfig(_Model):
    """Generation parameters sent with every request."""

    max_tokens: int = Field(512, ge=1)
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] = Field(default_factory=list)
    extra_body: dict[str, Any] = Field(default_factory=dict)
    #: Samples per item: each is its own result with its index (0..n-1), exactly once. vLLM and
    #: SGLang get one request with ``n``; other engines n requests with distinct seeds.
    n: int = Field(1, ge=1, le=1024)
    #: Top-k log-probabilities stored per generated token (0: none); see harvest/ledger/logprobs.py.
    logprobs: int = Field(0, ge=0)
    #: Ask for the n samples in one request (``n``): true for vLLM and SGLang when unset; false
    #: (n requests, distinct seeds) for llama-server (older builds refuse n != 1: "Only one
    #: completion choice is allowed"; recent ones take it) and for an endpoint of unknown kind. Set
    #: true for ``[client] endpoints`` served by vLLM or SGLang, or a llama-server that takes n.
    n_per_request: bool | None = None

    def one_request(self, engine: str | None) -> bool:
        """Whether the samples of an item go out as one request with ``n`` (see ``n_per_request``)."""
        if self.n_per_request is not None:
            return self.n_per_request
        return engine in ("vllm", "sglang")


class ClientConfig(_Model):
    """How the client talks to the server(s)."""

    #: Requests in flight, all endpoints together; "auto" (the default): a controller per endpoint
    #: finds what each can take from its gauges and answers (see harvest.client.autoconc), up to
    #: ``max_concurrency``. A number fixes it.
    concurrency: int | Literal["auto"] = Field("auto")
    #: Upper bound per endpoint of ``concurrency = "auto"``, and its starting value ``auto_start``
    #: (unset: the batch limit of the engine harvest launched, else 64).
    max_concurrency: int = Field(1024, ge=1)
    auto_start: int | None = Field(None, ge=1)
    request_timeout: float = Field(600.0, gt=0)
    max_retries: int = Field(3, ge=0)
    endpoints: list[str] = Field(default_factory=list, description="extra base URLs served by the same model")
    health_deadline: float = Field(600.0, gt=0, description="seconds a sick server may take to recover")
    #: Seconds an endpoint harvest does not manage (engine "openai", [client] endpoints) may take
    #: to answer ``GET /v1/models`` when the run starts; past it the run ends, items left pending.
    #: Shorter than ``health_deadline``: an endpoint that never answered is not one recovering.
    start_deadline: float = Field(60.0, gt=0, description="seconds an unmanaged endpoint may take to answer at start")
    #: With several endpoints: an item's requests (a conversation's turns, a shared system prompt) go
    #: to the server that likely holds its prefix, within a bounded load; false: least outstanding.
    prefix_affinity: bool = True

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

    #: Context for assistant turn k: the regenerated turns 0..k-1, or the input's original ones.
    history: Literal["regenerated", "original"] = "regenerated"
    #: Reasoning (``reasoning_content`` or a ``<think>`` block): not separated (none), kept apart
    #: from the answer (save), or removed (strip).
    reasoning: Literal["none", "save", "strip"] = "save"
    #: ``finish_reason=length``: keep as status truncated, retry once with ``retry_max_tokens``
    #: (then keep as truncated), or drop (status failed, class "truncated"; no text stored).
    truncated: Literal["keep", "retry", "drop"] = "keep"
    retry_max_tokens: int | None = Field(None, ge=1, description="max_tokens of the retry (default 2x)")
    #: Seconds between progress updates (display and progress.json).
    progress_interval: float = Field(5.0, gt=0)
    #: Times a managed server that died is relaunched during one run.
    max_relaunches: int = Field(5, ge=0)
    #: Circuit breaker: this many requests in a row failing with the same class and message
    #: (HTTP 400/401/403/404/422, context overflow) stop the run, leaving the items pending. 0: off.
    breaker_window: int = Field(20, ge=0)
    #: An empty or whitespace-only answer is asked again this many times (same settings); an item
    #: whose answer stays empty is failed with class "empty".
    empty_retries: int = Field(1, ge=0)
    #: Send claimed items sharing a prompt prefix (system prompt, a long shared head) close together,
    #: so the engine's prompt cache serves them (campaign/order.py); false: claim order (FIFO).
    prefix_order: bool = True


class OutputConfig(_Model):
    """Where the run folder lives."""

    dir: str = "harvest-run"

    @field_validator("dir")
    @classmethod
    def _path_length(cls, v: str) -> str:
        return check_path_text(v)


class HostConfig(_Model):
    """Where the server runs: a box reached over SSH (``ssh``) and/or a container entered with an
    exec prefix. The far side runs harvest's own JSON commands; see :mod:`harvest.placement.ssh`."""

    #: ``user@name`` (or a name from ~/.ssh/config); None: this machine (with ``exec_prefix`` only).
    ssh: str | None = None
    port: int = Field(22, ge=1, le=65535)
    identity_file: str | None = None
    #: Extra ``-o`` options for OpenSSH's client, each ``Key=Value`` (they win over harvest's own).
    ssh_options: list[str] = Field(default_factory=list)
    #: argv run before every far command, e.g. ``["pct", "exec", "101", "--"]``.
    exec_prefix: list[str] = Field(default_factory=list)
    #: The harvest executable on the far side (after the prefix).
    harvest: str = "harvest"
    #: The address the data tunnel forwards to on the far side (a container's own address).
    forward_to: str = "127.0.0.1"
    #: Seconds to establish the SSH connection (TCP, banner, key exchange).
    connect_timeout: float = Field(10.0, gt=0)
    #: Seconds one far command may take beyond the connection (a launch adds its ready_timeout).
    command_timeout: float = Field(120.0, gt=0)
    #: A label for tables and messages (default: ``ssh`` or ``local``).
    name: str | None = None
    #: Fields of [server] that differ on this host (``port``, a far ``model`` path, ``command``...).
    server: dict[str, Any] = Field(default_factory=dict)

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
    """A Ray cluster the servers run on (see :mod:`harvest.placement.ray.servers`); needs ``harvest[ray]``."""

    backend: Literal["ray"] = "ray"
    #: ``auto`` (the cluster this machine belongs to, ``ray start``), ``HOST:PORT`` or ``ray://HEAD:10001``.
    address: str = "auto"
    #: Servers to place, or ``"per_node"``: one on each node with room for one.
    servers: int | Literal["per_node"] = 1
    #: GPUs of each server (its tensor-parallel ranks), from Ray's assignment; 0 for CPU engines.
    gpus_per_server: int = Field(1, ge=0)
    #: Custom Ray resources each server's bundle asks for besides one CPU and its GPUs.
    resources: dict[str, float] = Field(default_factory=dict)
    #: Ray runtime_env of the servers' actors (``env_vars``, ``py_modules``, ...): harvest must be
    #: importable on every node, the same version as here.
    runtime_env: dict[str, Any] = Field(default_factory=dict)
    #: Ray namespace of the servers' named actors and placement groups.
    namespace: str = "harvest"
    #: Seconds to connect to the cluster and to wait for a placement.
    connect_timeout: float = Field(60.0, gt=0)

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
    args = list(server.extra_args)
    for i, arg in enumerate(args):
        value = None
        if arg == "--max-logprobs" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--max-logprobs="):
            value = arg.split("=", 1)[1]
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
    "parse_config",
]
