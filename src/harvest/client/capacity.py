"""What an engine harvest did not launch publishes of its capacity, asked once before any item.

For ``concurrency = "auto"``, an endpoint whose engine harvest does not know (``engine = "openai"``,
``engine = "command"``, ``[client] endpoints``) is asked, during the client's start check, the three
at once, each within the probe timeout:

    GET /server_info?config_format=json   SGLang 0.5.23 (``srt/entrypoints/http_server.py``): the sum over
                                          its data-parallel ranks of ``internal_states[i].
                                          effective_max_running_requests_per_dp`` (what its scheduler
                                          runs at once), else the top-level ``max_running_requests``;
                                          ``max_total_num_tokens`` (KV). A 404 asks ``/get_server_info``
                                          (deprecated in 0.5.23, the only one of older servers).
                                          vLLM answers the same path only in its development mode
                                          (``VLLM_SERVER_DEV_MODE=1``, ``entrypoints/serve/dev/
                                          server_info``): ``vllm_config.scheduler_config.max_num_seqs``
    GET /props                            llama-server: ``total_slots`` (and ``default_generation_
                                          settings.n_ctx``, the context of one slot)
    GET /metrics                          whether the controller has the queue gauges it steers on
                                          (vLLM, SGLang, llama-server names: :data:`~harvest.client.
                                          autoconc.readings.RUNNING`); vLLM's ``vllm:cache_config_info``
                                          (its CacheConfig as labels): ``num_gpu_blocks`` x
                                          ``block_size``, its KV capacity in tokens (shown, not steered on)

What comes back is an :class:`~harvest.client.engine.EngineLimit` with its ``source``, the words the
panel and ``status --json`` show as the first level's reason:

    a batch published (SGLang, llama-server, vLLM's dev mode)   that batch, exact: the first level is it
                                                                (plus a short queue with /metrics)
    queue gauges, no batch (vLLM: ``max_num_seqs`` is          :data:`GAUGED_START`, vLLM's default on a
      published nowhere else)                                  GPU, not exact: its gauges find the rest
    nothing (``transformers serve``, an unknown server)        no batch, no /metrics: the controller
                                                                starts high (:data:`~harvest.client.
                                                                autoconc.settings.UNKNOWN_START`)

Nothing here fails a run or changes an endpoint's health: an answer that is missing, late, bigger
than :data:`~harvest.client.replies.PROBE_BYTES`, or of another shape is "not published". Each shape read is pinned in ``tests/client/test_capacity.py``
and listed in ``docs/engines.md``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harvest.client.autoconc.readings import GAUGE_NAMES, Gauges
from harvest.client.endpoints import endpoint_url
from harvest.client.engine import EngineLimit
from harvest.client.metrics import MetricsFormatError, keep_only, parse_prometheus_text, sum_by_name
from harvest.client.replies import PROBE_BYTES
from harvest.transport import RawResponse, Transport, TransportError

#: A count an engine publishes: a JSON integer above 0 (not a string, not a bool).
Count = Annotated[int, Field(gt=0, strict=True)]

#: The first level of an engine with queue gauges that publishes no batch limit: vLLM's
#: ``max_num_seqs`` default on a GPU under 70 GiB (``EngineArgs.get_batch_defaults``, 0.32; 1024
#: above it, 128 on its CPU build), where a managed vLLM on GPUs starts too. Its gauges show what it
#: runs at once within a scrape or two: a queue brings the level down to that plus a short queue,
#: room above it takes it up.
GAUGED_START = 256

#: vLLM's info gauge of its cache config (read only for the KV capacity shown with the reason).
VLLM_CACHE_INFO = "vllm:cache_config_info"


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _DpState(_Loose):
    effective_max_running_requests_per_dp: Count | None = None


class _SGLangInfo(_Loose):
    max_running_requests: Count | None = None
    max_total_num_tokens: Count | None = None
    internal_states: list[_DpState] = Field(default_factory=list)


class _VllmScheduler(_Loose):
    max_num_seqs: Count | None = None


class _VllmConfig(_Loose):
    scheduler_config: _VllmScheduler | None = None


class _VllmInfo(_Loose):
    vllm_config: _VllmConfig


class _Slot(_Loose):
    n_ctx: Count | None = None


class _Props(_Loose):
    total_slots: Count | None = None
    default_generation_settings: _Slot | None = None


@dataclass(frozen=True)
class _Batch:
    """A batch limit one endpoint published and where."""

    size: int
    source: str


def server_info_batch(doc: Any, path: str) -> _Batch | None:
    """The batch limit in a ``/server_info`` answer: SGLang's, or vLLM's in its development mode."""
    if not isinstance(doc, Mapping):
        return None
    shown = path.split("?")[0]
    if isinstance(doc.get("vllm_config"), Mapping):
        try:
            seqs = _VllmInfo.model_validate(doc).vllm_config.scheduler_config
        except ValidationError:
            return None
        return _Batch(seqs.max_num_seqs, f"max_num_seqs {seqs.max_num_seqs} on {shown} (vLLM)") \
            if seqs is not None and seqs.max_num_seqs is not None else None
    try:
        info = _SGLangInfo.model_validate(doc)
    except ValidationError:
        return None
    ranks = [s.effective_max_running_requests_per_dp for s in info.internal_states]
    kv = f", KV {info.max_total_num_tokens} tokens" if info.max_total_num_tokens else ""
    if ranks and all(n is not None for n in ranks):
        total = sum(n for n in ranks if n is not None)
        dp = f" over {len(ranks)} data-parallel ranks" if len(ranks) > 1 else ""
        return _Batch(total, f"engine capacity {total} from {shown}{dp}{kv}")
    if info.max_running_requests is not None:
        return _Batch(info.max_running_requests, f"engine capacity {info.max_running_requests} from "
                                                 f"{shown} max_running_requests{kv}")
    return None


def props_batch(doc: Any) -> _Batch | None:
    """The slots in llama-server's ``/props`` answer."""
    if not isinstance(doc, Mapping):
        return None
    try:
        props = _Props.model_validate(doc)
    except ValidationError:
        return None
    if props.total_slots is None:
        return None
    slot = props.default_generation_settings
    ctx = f", {slot.n_ctx} tokens of context each" if slot is not None and slot.n_ctx else ""
    return _Batch(props.total_slots, f"engine capacity {props.total_slots} from /props{ctx}")


def metrics_reading(text: str) -> tuple[bool, int | None]:
    """From a ``/metrics`` text: whether it has the queue gauges the controller steers on, and
    vLLM's KV capacity in tokens (None: not shown)."""
    try:
        samples = parse_prometheus_text(keep_only(text, GAUGE_NAMES | {VLLM_CACHE_INFO}))
    except MetricsFormatError:
        return False, None
    gauges = Gauges.from_metrics(sum_by_name(s for s in samples if s.name != VLLM_CACHE_INFO))
    kv = None
    for sample in samples:
        if sample.name == VLLM_CACHE_INFO:
            labels = dict(sample.labels)
            blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
            if blocks.isdigit() and size.isdigit():
                kv = int(blocks) * int(size)
    queued = gauges is not None and gauges.running is not None and gauges.waiting is not None
    return queued, kv


def verdict(info: _Batch | None, props: _Batch | None, gauges: bool, kv: int | None) -> EngineLimit:
    """What an endpoint published, as the controller's :class:`EngineLimit` (module docstring)."""
    published = info or props
    if published is not None:
        return EngineLimit(published.size, exact=True, metrics=gauges, source=published.source)
    if gauges:
        shown = f" (KV {kv} tokens)" if kv else ""
        return EngineLimit(GAUGED_START, exact=False, metrics=True,
                           source=f"no batch limit published{shown}: {GAUGED_START}, vLLM's default on a "
                                  "GPU, steered on its /metrics gauges")
    return EngineLimit(None, exact=False, metrics=False, hint=False,
                       source="nothing published (/server_info, /props, /metrics): starting high")


async def ask_capacity(transport: Transport, headers: Mapping[str, str], url: str, timeout: float) -> EngineLimit:
    """Ask the endpoint ``url`` what its engine publishes (module docstring); never raises for
    what the endpoint answers."""

    async def get(path: str) -> RawResponse | None:
        try:
            return await transport.request("GET", endpoint_url(url, path), headers=headers, timeout=timeout,
                                           max_bytes=PROBE_BYTES)
        except TransportError:
            return None

    async def info() -> _Batch | None:
        for path in ("/server_info?config_format=json", "/get_server_info"):
            answer = await get(path)
            if answer is not None and answer.status == 200:
                return server_info_batch(_json(answer.body), path)
            if answer is None or answer.status != 404:
                return None
        return None

    async def props() -> _Batch | None:
        answer = await get("/props")
        return props_batch(_json(answer.body)) if answer is not None and answer.status == 200 else None

    async def metrics() -> tuple[bool, int | None]:
        answer = await get("/metrics")
        if answer is None or answer.status != 200:
            return False, None
        return metrics_reading(answer.body.decode("utf-8", errors="replace"))

    batch, slots, (gauges, kv) = await asyncio.gather(info(), props(), metrics())
    return verdict(batch, slots, gauges, kv)


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None


__all__ = ["GAUGED_START", "VLLM_CACHE_INFO", "ask_capacity", "metrics_reading", "props_batch",
           "server_info_batch", "verdict"]
