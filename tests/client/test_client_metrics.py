"""The Prometheus text parser and the /metrics scraper."""

from __future__ import annotations

import math

import pytest

from harvest.client import MockTransport, RawResponse, Unreachable
from harvest.client.metrics import (
    MetricsFormatError,
    Sample,
    keep_only,
    parse_prometheus_text,
    scrape_metrics,
    sum_by_name,
)
from harvest.errors import ProbeError, ServerSick

VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 12.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-8B"} 4.0
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 30.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="m"} 1.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 9.0
vllm:e2e_request_latency_seconds_sum{model_name="m"} 42.5 1712345678000
sglang:num_running_reqs{name="a, \\"quoted\\" } brace",tp_rank="0"} 7
sglang:num_running_reqs { tp_rank = "1" , } 3
sglang:cache_hit_rate NaN
process_start_time_seconds 1.7e+09
python_gc_objects_collected_total{generation="0"} 100.0 # {trace_id="abc"} 1.0
{"my.dotted.metric", shard="x\\ny"} -Inf
# EOF
"""


def test_parser_reads_labels_escapes_timestamps_exemplars_and_quoted_names():
    samples = parse_prometheus_text(VLLM_TEXT)
    assert samples[0] == Sample("vllm:num_requests_running",
                                (("engine", "0"), ("model_name", "Qwen/Qwen3-8B")), 12.0)
    assert samples[4].labels == (("le", "+Inf"), ("model_name", "m"))
    assert samples[5].value == 42.5
    assert samples[6].labels == (("name", 'a, "quoted" } brace'), ("tp_rank", "0"))
    assert samples[7] == Sample("sglang:num_running_reqs", (("tp_rank", "1"),), 3.0)
    assert math.isnan(samples[8].value)
    assert samples[10].value == 100.0
    assert samples[11] == Sample("my.dotted.metric", (("shard", "x\ny"),), -math.inf)
    assert len(samples) == 12


def test_sum_by_name_adds_over_labels_and_skips_nan():
    totals = sum_by_name(parse_prometheus_text(VLLM_TEXT))
    assert totals["vllm:num_requests_running"] == 16.0
    assert totals["vllm:num_requests_waiting"] == 30.0
    assert totals["sglang:num_running_reqs"] == 10.0
    assert "sglang:cache_hit_rate" not in totals


@pytest.mark.parametrize("line", [
    "metric",
    "metric{a=\"1\" 2",
    "metric{a=1} 2",
    "metric{a=\"unterminated} 2",
    "metric twelve",
    "9metric 1",
])
def test_malformed_lines_are_named(line):
    with pytest.raises(MetricsFormatError) as caught:
        parse_prometheus_text(f"ok 1\n{line}\n")
    assert caught.value.line_number == 2 and caught.value.line == line and line in str(caught.value)


def test_keep_only_parses_just_the_named_metrics():
    kept = keep_only(VLLM_TEXT, {"vllm:num_requests_running", "sglang:num_running_reqs"})
    assert sum_by_name(parse_prometheus_text(kept)) == {"vllm:num_requests_running": 16.0,
                                                        "sglang:num_running_reqs": 10.0}
    assert keep_only(VLLM_TEXT, {"vllm:num_requests"}) == "\n"  # a prefix of a name is not the name


async def test_scrape_sums_404_is_empty_and_failures_are_typed():
    answers = {
        "http://ok:1/metrics": RawResponse(200, VLLM_TEXT.encode()),
        "http://nometrics:1/metrics": RawResponse(404, b"Not Found"),
        "http://broken:1/metrics": RawResponse(500, b""),
        "http://garbage:1/metrics": RawResponse(200, b"<html>\n"),
    }

    def handler(method, url, body, headers):
        if url not in answers:
            raise Unreachable("refused")
        return answers[url]

    transport = MockTransport(handler)
    ok = await scrape_metrics("http://ok:1/v1", transport=transport)
    assert ok["vllm:num_requests_running"] == 16.0
    assert await scrape_metrics("http://nometrics:1", transport=transport) == {}
    with pytest.raises(ServerSick) as sick:
        await scrape_metrics("http://broken:1", transport=transport)
    assert sick.value.status == 500
    with pytest.raises(ServerSick):
        await scrape_metrics("http://gone:1", transport=transport)
    with pytest.raises(ProbeError, match="not Prometheus text"):
        await scrape_metrics("http://garbage:1", transport=transport)
    assert not transport.closed  # a transport that was passed in stays open


# --- prefix-cache hit rate ---------------------------------------------------------------

VLLM_CACHE = """# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {queries}
# HELP vllm:prefix_cache_hits Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}
"""


def test_prefix_cache_hit_rate_counts_from_the_first_scrape_over_every_endpoint():
    from harvest.client.metrics import PrefixCacheMeter, parse_prometheus_text, sum_by_name

    def scrape(hits: float, queries: float) -> dict[str, float]:
        return sum_by_name(parse_prometheus_text(VLLM_CACHE.format(hits=hits, queries=queries)))

    meter = PrefixCacheMeter()
    assert meter.hit_rate() is None
    # the engine served 1000 tokens before this run (half of them hits): not this run's
    meter.observe({"http://a:1": scrape(500, 1000), "http://b:1": scrape(0, 0)})
    assert meter.hit_rate() is None
    meter.observe({"http://a:1": scrape(1400, 2000), "http://b:1": scrape(100, 1000)})
    assert meter.hit_rate() == (900 + 100) / (1000 + 1000)
    # b restarted: its counters went back; what it counted before is kept
    meter.observe({"http://a:1": scrape(1400, 2000), "http://b:1": scrape(50, 100)})
    assert meter.totals() == (900 + 100 + 50, 1000 + 1000 + 100)
    snap = meter.snapshot()
    assert snap["hit_rate"] == round(1050 / 2100, 4) and snap["query_tokens"] == 2100


def test_prefix_cache_hit_rate_of_an_engine_with_a_gauge_only():
    from harvest.client.metrics import PrefixCacheMeter

    meter = PrefixCacheMeter()
    meter.observe({"http://a:1": {"sglang:cache_hit_rate": 0.25}, "http://b:1": {"sglang:cache_hit_rate": 0.75},
                   "http://c:1": {}})
    assert meter.hit_rate() == 0.5
    assert meter.snapshot() == {"hit_rate": 0.5, "hit_tokens": None, "query_tokens": None}


async def test_a_client_scrapes_its_endpoints_at_once_and_a_hung_one_neither_delays_nor_blanks_the_rest():
    """The display's scrape of every endpoint: one server that hangs on /metrics (busy, or half dead)
    maps to {} after ``timeout``, and the others are asked at the same time, not after it in turn."""
    import asyncio

    from harvest.client import Client

    fine = "http://127.0.0.1:9002"
    hung = [f"http://127.0.0.1:{port}" for port in (9001, 9003, 9004)]
    waiting: set[str] = set()
    most = 0

    async def handler(method, url, body, headers):
        nonlocal most
        if not url.startswith(fine):
            waiting.add(url)
            most = max(most, len(waiting))
            try:
                await asyncio.sleep(30)
            finally:
                waiting.discard(url)
        return RawResponse(200, b"vllm:num_requests_running 5\nvllm:num_requests_waiting 2\n")

    async with Client([hung[0], fine, *hung[1:]], model="m", transport=MockTransport(handler)) as client:
        scraped = await client.scrape_metrics(timeout=1.0)
    assert scraped[fine] == {"vllm:num_requests_running": 5.0, "vllm:num_requests_waiting": 2.0}
    assert all(scraped[url] == {} for url in hung), scraped
    assert most == 3, most  # the three hung endpoints were waited on together, not one after another
