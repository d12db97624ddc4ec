"""The tables of what a job does: ``[preflight]`` (margins of the launch-safety rules), ``[data]``
(the input and its field mapping), ``[sampling]`` (generation parameters), ``[client]``
(concurrency, timeouts, retries, extra endpoints), ``[run]`` (conversations, reasoning, truncated
answers) and ``[output]`` (the run folder).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from harvest.config.base import MAX_CONCURRENCY, StrictModel, check_path_text


class PreflightConfig(StrictModel):
    """Margins of the launch-safety rules."""

    memory_margin_mib: int = Field(1024, ge=0, description="free MiB required beyond the engine's claim")
    ram_reserve_gib: float = Field(8.0, ge=0, description="host RAM kept free beyond vLLM CPU's "
                                   "VLLM_CPU_KVCACHE_SPACE (SGLang's host pool keeps SGLang's own 10 GiB)")
    max_swap_used_mib: int = Field(1024, ge=0, description="swap in use above which a launch is refused (MiB)")
    min_disk_free_gib: float = Field(10.0, ge=0, description="free disk required in the run folder's "
                                     "file system (GiB)")
    default_claim_fraction: float = Field(0.9, gt=0, le=1, description="share of each GPU's memory an engine "
                                          "without a fraction setting is taken to claim")


class DataConfig(StrictModel):
    """The input dataset and its field mapping."""

    path: str = Field(description="the dataset: JSONL, a JSON array, Parquet, CSV, or a `save_to_disk` folder")
    format: Literal["auto", "jsonl", "json", "parquet", "csv", "hf"] = Field(
        "auto", description="the file format; auto: from the name (a folder is `hf`)")
    shape: Literal["auto", "prompt", "messages", "sharegpt", "specforge", "openai-batch"] = Field(
        "auto", description="a prompt field, OpenAI `messages`, ShareGPT / SpecForge `conversations`, or "
        "`openai-batch` (an OpenAI batch input file: each line's `body` is its request, docs/batch-files.md); "
        "auto: detected per row, a file whose first record has `custom_id` and `body` is a batch file")
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
                                     "its rows skipped exits 1 (every row skipped, or no row at all, always does)")

    @field_validator("path")
    @classmethod
    def _path_length(cls, v: str) -> str:
        return check_path_text(v)


class SamplingConfig(StrictModel):
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
                          "the ledger (0: none), sorted, the true top k: vLLM lists the sampled token first, "
                          "so harvest asks for k + 1 and keeps the k highest (at vLLM's max_logprobs it asks "
                          "k, and the k-th may be the sampled token)")
    n_per_request: bool | None = Field(None, description="the n samples as one request with `n`; unset: true "
                                       "for vLLM and SGLang, false (n seeded requests) for llama-server and "
                                       "endpoints of unknown kind")

    def one_request(self, engine: str | None) -> bool:
        """Whether the samples of an item go out as one request with ``n`` (see ``n_per_request``)."""
        if self.n_per_request is not None:
            return self.n_per_request
        return engine in ("vllm", "sglang")


class ClientConfig(StrictModel):
    """How the client talks to the server(s)."""

    concurrency: int | Literal["auto"] = Field("auto", description="requests in flight, all endpoints together. "
                                               "auto: a controller per endpoint steers by the engine's gauges "
                                               "(running, waiting, KV use) and token counter, or a canary "
                                               "request without /metrics, from `auto_start` up to "
                                               "`max_concurrency` (harvest.client.autoconc). A number fixes it")
    max_concurrency: int = Field(1024, ge=1, description="upper bound per endpoint of concurrency = \"auto\"")
    auto_start: int | None = Field(None, ge=1, description="where concurrency = \"auto\" starts; unset: the "
                                   "batch limit of the engine harvest launched, else what the engine publishes "
                                   "(/server_info, /props), else 256 with queue gauges, else 1024")
    request_timeout: float = Field(600.0, gt=0, description="seconds one request may take")
    max_retries: int = Field(3, ge=0, description="attempts charged to an item beyond its first before it "
                             "fails; a sick or dead server holds requests instead of charging them")
    endpoints: list[str] = Field(default_factory=list, description="extra base URLs served by the same model")
    health_deadline: float = Field(600.0, gt=0, description="seconds a sick server may take to recover (a "
                                   "server harvest launched is relaunched after hang_deadline instead)")
    hang_deadline: float = Field(120.0, gt=0, description="seconds a server harvest launched may stay hung "
                                 "(requests in flight, nothing back past 3 x the p90 of its recent answers, "
                                 "`hang_floor` at least, and no generated token counted) or sick (`/health` "
                                 "silent too: a frozen engine, a paused container) before it is stopped and "
                                 "relaunched; an endpoint harvest does not manage gets no more requests while "
                                 "hung and is given up after health_deadline")
    hang_floor: float = Field(30.0, gt=0, description="seconds of quiet (requests in flight, nothing back) that "
                              "may count as a hang however fast the engine's recent answers were; lower it only "
                              "where every answer takes well under a second")
    stream: bool = Field(False, description="stream every answer (`stream: true`, usage included) and record "
                         "per item the time to first token (TTFT) and per output token after it (TPOT), and "
                         "the gaps between tokens (ITL), each from the request's send, apart from the wait in "
                         "harvest's queue: shown by `status`, the panel and the report")
    start_deadline: float = Field(60.0, gt=0, description="seconds an endpoint harvest does not manage may take "
                                  "to answer when the run starts; past it the run ends, items left pending")
    reply_bytes_per_token: int = Field(64, ge=8, le=1 << 20, description="what one answer may carry, read as it "
                                       "comes: 256 KiB + max_tokens x n x this many bytes (4 x more a token per "
                                       "log-probability asked); a bigger answer, after decompression, fails as "
                                       "`oversized` and nothing of it is kept. A stream is also cut once a choice "
                                       "streamed past max_tokens (truncated). Raise it for an endpoint whose "
                                       "answers carry more per token")
    metrics_port: int | None = Field(None, ge=0, le=65535, description="serve harvest's own Prometheus /metrics "
                                     "on this port while a run goes (items by status as the ledger holds them, "
                                     "tokens, requests in flight and concurrency per endpoint, latency, TTFT and "
                                     "TPOT histograms, relaunches, hangs, errors by class: docs/metrics.md); 0: "
                                     "a free port the system picks (its URL in the log and runner.json); unset: off")
    metrics_host: str = Field("127.0.0.1", min_length=1, description="the address /metrics listens on "
                              "(loopback by default; 0.0.0.0 exposes it to the network)")
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


class RunConfig(StrictModel):
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
    breaker_window: int = Field(20, ge=0, description="requests in a row failing the same way (any HTTP "
                                "4xx, 408/409/425/429 once their retries are spent, context overflow, an answer "
                                "that is no completion, oversized or not HTTP) that stop the run, items left "
                                "pending; a redirect stops it at once; 0: off")
    max_failed_share: float = Field(0.5, ge=0, le=1, description="a run ending with more than this share of its "
                                    "items failed (after their retries) exits 1: `harvest run --help`'s \"too many "
                                    "failed\"; `harvest run --retry failed` asks them again")
    empty_retries: int = Field(1, ge=0, description="times an empty answer is asked again before the item "
                               "fails with class \"empty\"")
    prefix_order: bool = Field(True, description="claimed items sharing a prompt prefix are sent together so "
                               "the engine's prompt cache serves them; false: claim order")


class OutputConfig(StrictModel):
    """Where the run folder lives."""

    dir: str = Field("harvest-run", description="the run folder: ledger, records, server log, exports")

    @field_validator("dir")
    @classmethod
    def _path_length(cls, v: str) -> str:
        return check_path_text(v)


__all__ = ["ClientConfig", "DataConfig", "OutputConfig", "PreflightConfig", "RunConfig", "SamplingConfig"]
