"""Disk planning for token log-probabilities: how many bytes a run's logprobs will take, checked
against the free space of the output's file system before anything is generated.

The estimate is an upper bound per sample: every assistant turn at ``max_tokens`` (the retry's
``retry_max_tokens`` when truncated answers are retried) at ``6 + 6k`` bytes per token
(ledger/logprobs.py), times the samples still to generate. When the input is not fully ingested
yet, its rows are extrapolated from the first batch: the dataset's size over the bytes of the
normalized inputs read so far, or, for JSON Lines and CSV files, its line count (said so in the
message).
"""

from __future__ import annotations

import json
import logging
import shutil
import dataclasses
from pathlib import Path

from harvest.config import HarvestConfig
from harvest.errors import PreflightFailed
from harvest.gpu.preflight import RuleResult
from harvest.ledger import IngestBatch, IngestReport, Ledger, Status
from harvest.ledger.logprobs import bytes_per_token, record_bytes

log = logging.getLogger("harvest.campaign")

#: Inputs of the first batch read to measure the average number of assistant turns.
_TURN_SAMPLE = 1000


def _gib(n: float) -> str:
    return f"{n / 2**30:,.2f} GiB"


def _turns(batch: IngestBatch) -> float:
    """Average user turns (= assistant turns generated) of the batch's inputs (at least 1)."""
    texts = list(batch.inputs.values())[:_TURN_SAMPLE]
    if not texts:
        return 1.0
    turns = 0
    for text in texts:
        messages = json.loads(text).get("messages") or []  # Item.to_json: [[role, content], ...]
        turns += max(1, sum(1 for m in messages if m and m[0] == "user"))
    return turns / len(texts)


def _dataset_bytes(path: str) -> int:
    p = Path(path)
    if p.is_dir():
        return sum(q.stat().st_size for q in p.rglob("*") if q.is_file())
    return p.stat().st_size


def _count_lines(path: str) -> int | None:
    """Lines of a JSON Lines or CSV file (a fast byte count), or None for other inputs."""
    p = Path(path)
    if not p.is_file() or p.suffix.lower() not in (".jsonl", ".ndjson", ".csv"):
        return None
    lines = 0
    last = b"\n"
    with open(p, "rb") as f:
        while chunk := f.read(1 << 22):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")


def logprob_space(config: HarvestConfig, ledger: Ledger, batch: IngestBatch, report: IngestReport) -> RuleResult:
    """How many bytes the logprobs still to store may take, against the output's free space."""
    sampling, run = config.sampling, config.run
    k = sampling.logprobs
    tokens = sampling.max_tokens
    if run.truncated == "retry":
        tokens = max(tokens, run.retry_max_tokens or 2 * sampling.max_tokens)
    turns = _turns(batch)
    per_sample = record_bytes(int(round(turns * tokens)), k, max(1, round(turns)))
    counts = ledger.counts()
    todo = counts[Status.PENDING] + counts[Status.RUNNING]
    how = f"{report.unique:,} unique inputs"
    if not report.complete and config.data is not None:
        rows = _count_lines(config.data.path)
        if rows is not None:  # an upper bound: every line a row, none a duplicate
            extra = max(0, rows - report.total_rows)
            how = f"up to {report.unique + extra:,} unique inputs ({rows:,} lines)"
        else:
            read = sum(len(t) for t in batch.inputs.values()) or 1
            try:
                total = _dataset_bytes(config.data.path)
            except OSError:
                total = read
            extra = int(report.unique * (max(1.0, total / read) - 1))
            how = (f"about {report.unique + extra:,} unique inputs (extrapolated by size from the first"
                   f" {report.total_rows:,} rows)")
        todo += extra * sampling.n
    needed = todo * per_sample
    free = shutil.disk_usage(ledger.path.parent).free
    detail = (f"logprobs need up to {_gib(needed)}: {todo:,} samples still to generate ({how}, n = {sampling.n})"
              f" x {turns:.2f} turns x max_tokens {tokens} x {bytes_per_token(k)} B/token at top-{k};"
              f" {ledger.path.parent} has {_gib(free)} free")
    return RuleResult("logprob_disk", needed <= free, detail, numbers={"needed": needed, "free": free})


def check_logprob_space(config: HarvestConfig, ledger: Ledger, batch: IngestBatch, report: IngestReport,
                        *, force: bool) -> RuleResult | None:
    """Refuse (:class:`PreflightFailed`) a run whose logprobs cannot fit, unless ``force``."""
    if not config.sampling.logprobs:
        return None
    check = logprob_space(config, ledger, batch, report)
    log.info("preflight %s: %s", "ok" if check.passed else "FAILED", check.detail)
    if not check.passed and not force:
        raise PreflightFailed([dataclasses.replace(check, detail=check.detail + " (lower max_tokens, logprobs"
                                                   " or n, free space, or --force)")])
    return check


def describe_samples(config: HarvestConfig) -> str | None:
    """The start-of-run line on how the samples of an item are asked for (None when n = 1)."""
    s = config.sampling
    if s.n == 1 and not s.logprobs:
        return None
    engine = config.server.engine if config.server is not None else None
    parts = []
    if s.n > 1:
        if s.one_request(engine):
            parts.append(f"{s.n} samples per item, asked as one request with n = {s.n} per item")
        else:
            seeds = f"seeds {s.seed}..{s.seed + s.n - 1}" if s.seed is not None else "distinct random seeds"
            why = ("older llama-server builds refuse n != 1; set [sampling] n_per_request = true for one that"
                   " takes n" if engine == "llamacpp" else
                   f"engine {engine or 'unknown ([client] endpoints)'}: set [sampling] n_per_request = true"
                   " if it honours n")
            parts.append(f"{s.n} samples per item, asked as {s.n} separate requests with {seeds} ({why})")
        if s.temperature == 0:
            parts.append("temperature 0: the samples will be alike")
    if s.logprobs:
        parts.append(f"top-{s.logprobs} logprobs per generated token stored in logprobs/")
    return "; ".join(parts)


__all__ = ["check_logprob_space", "describe_samples", "logprob_space"]
