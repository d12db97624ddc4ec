"""Export a run's results from its ledger: SpecForge / ShareGPT JSONL, OpenAI batch output, Parquet.

    report = export_run(run_dir, "sharegpt", statuses=("done", "truncated"))
    report.path, report.written, report.malformed

Formats (docs/result-schema.md has every line's schema):

- ``specforge``: JSONL ``{"id", "status": "success", "conversations": [{"role", "content",
  "reasoning_content"?}]}``, what SpecForge's own regeneration writes and its validator
  (``scripts/validate_regenerated_data.py``) accepts: the user's id, the whole regenerated
  conversation. Only items that finished (``done``) by default; ``truncated`` ones only when asked,
  marked ``"truncated": true``. An assistant turn with neither text nor reasoning is no training
  data: such a row is reported as malformed, never written as a success.
- ``sharegpt``: the same conversations without ``status``; ``sharegpt_style="from-value"`` writes
  ``{"from": "system"|"human"|"gpt", "value"}`` turns instead.
- ``openai-batch``: JSONL lines of an OpenAI Batch API output file, one per item (by default every
  item that ended: one line per input line of a complete run, in input order); failed and skipped
  items carry ``response: null`` and ``error: {code, message}``. A batch row's body is its own
  request's answer (``chat.completion`` or ``text_completion``, every choice, logprobs as sent).
- ``parquet``: one row per item (pyarrow, the ``parquet`` extra), written in row groups.

Guarantees: rows are streamed from the ledger (``Ledger.iter_results``) and written as they come, so
memory does not grow with the run; the output appears complete or not at all (a temporary file in
the same folder, fsync, rename); an assistant turn that has ``reasoning_content`` never keeps a raw
``<think>`` block in its ``content``; every exported conversation is checked (leading system
messages, then user and assistant alternating, ending with an assistant answer) and a result that
fails the check is reported as malformed, never written half-right and never dropped silently.

This module only reads the ledger; it never changes an item's status and never generates.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from harvest import safefiles
from harvest.campaign.outputs.batch_output import MalformedResult, batch_body, hex_id
from harvest.campaign.outputs.selection import (
    DEFAULT_STATUSES,
    FORMAT_DEFAULT_STATUSES,
    nothing_selected,
    parse_statuses,
    selected_statuses,
)
from harvest.errors import ConfigError
from harvest.ledger import RESULT_STATUSES, Ledger, ResultRow, Status

FORMATS = ("specforge", "sharegpt", "openai-batch", "parquet", "logprobs")
SHAREGPT_STYLES = ("role-content", "from-value")
#: Statuses each format can hold: conversation formats need a result; the batch output file has a
#: line per request that ended (answered or not); Parquet holds any row.
ALLOWED_STATUSES: Mapping[str, tuple[Status, ...]] = {
    "specforge": RESULT_STATUSES,
    "sharegpt": RESULT_STATUSES,
    "openai-batch": (Status.DONE, Status.TRUNCATED, Status.FAILED, Status.SKIPPED),
    "parquet": tuple(Status),
    "logprobs": RESULT_STATUSES,  # campaign/outputs/export_logprobs.py: one row per sample and turn
}
#: ShareGPT ``from`` names of each role.
FROM_NAMES: Mapping[str, str] = {"system": "system", "user": "human", "assistant": "gpt"}
ROW_GROUP_SIZE = 10_000
#: A Parquet row group is also closed once its text reaches this many characters.
_ROW_GROUP_CHARS = 64 * 2**20
_MALFORMED_EXAMPLES = 20

_THINK_BLOCK = re.compile(r"<think>(.*?)(?:</think>|\Z)", re.DOTALL)


@dataclass(frozen=True)
class ExportReport:
    """What an export wrote."""

    path: Path
    format: str
    #: Items (one per sample) written.
    written: int
    #: Items written per status.
    by_status: Mapping[str, int]
    #: Results that could not be exported (not in the documented schema), and the first few of
    #: them as ``(item id, why)``.
    malformed: int = 0
    malformed_examples: tuple[tuple[str, str], ...] = ()
    #: False when nothing was selected and ``allow_empty`` was off: no file was left at ``path``.
    kept: bool = True
    #: ``logprobs``: results of the selected statuses that carry no log-probabilities.
    without_logprobs: int = 0
    #: Records in the file: one per item, or for ``logprobs`` one per sample and turn.
    rows: int = 0


# ------------------------------------------------------------------------------------ options


def default_output(run_dir: str | Path, fmt: str) -> Path:
    """``RUN_DIR/export.<format>.jsonl``, or ``RUN_DIR/export.parquet``."""
    if fmt in ("parquet", "logprobs"):
        return Path(run_dir) / ("export.parquet" if fmt == "parquet" else "export.logprobs.parquet")
    return Path(run_dir) / f"export.{fmt}.jsonl"


def _check_options(fmt: str, statuses: Sequence[Status], sharegpt_style: str) -> None:
    problems = []
    if fmt not in FORMATS:
        problems.append(("--format", f"unknown format {fmt!r} (one of {', '.join(FORMATS)})"))
    else:
        bad = [s.value for s in statuses if s not in ALLOWED_STATUSES[fmt]]
        if bad:
            allowed = ", ".join(s.value for s in ALLOWED_STATUSES[fmt])
            problems.append(("--status", f"{fmt} export cannot hold {', '.join(bad)} items"
                                         f" (they have no result to export); allowed: {allowed}"))
    if not statuses:
        problems.append(("--status", "no status selected"))
    if sharegpt_style not in SHAREGPT_STYLES:
        problems.append(("--sharegpt-style",
                         f"unknown style {sharegpt_style!r} (one of {', '.join(SHAREGPT_STYLES)})"))
    elif sharegpt_style != "role-content" and fmt != "sharegpt":
        problems.append(("--sharegpt-style", f"applies to the sharegpt format only, not {fmt}"))
    if problems:
        raise ConfigError("harvest export options", problems)


# ------------------------------------------------------------------------------------ conversations


def split_think(content: str, reasoning: str | None) -> tuple[str, str | None]:
    """Take raw ``<think>`` blocks (and a lone leading ``...</think>``) out of ``content`` when the
    turn has reasoning kept apart. Text found there and not already in ``reasoning`` is appended to
    it, so nothing is lost. Without ``reasoning`` the content is returned as is (the run chose not
    to separate reasoning)."""
    if reasoning is None or ("<think>" not in content and "</think>" not in content):
        return content, reasoning
    found = [m.strip() for m in _THINK_BLOCK.findall(content)]
    rest = _THINK_BLOCK.sub("", content)
    head, sep, tail = rest.partition("</think>")
    if sep:  # a template that opened <think> in the prompt leaves only the closing tag
        found.insert(0, head.strip())
        rest = tail
    for part in found:
        if part and part not in reasoning:
            reasoning = f"{reasoning}\n\n{part}" if reasoning.strip() else part
    return rest.lstrip(), reasoning


def conversation(row: ResultRow) -> list[dict[str, Any]]:
    """The regenerated conversation of a row with a result: ``[{"role", "content",
    "reasoning_content"?}]``, think blocks moved out of content. Raises :class:`MalformedResult`."""
    out = row.output
    if not isinstance(out, Mapping) or not isinstance(out.get("messages"), list):
        raise MalformedResult("output has no 'messages' list")
    messages = []
    for i, m in enumerate(out["messages"]):
        if not (isinstance(m, Mapping) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)):
            raise MalformedResult(f"messages[{i}] is not {{role: str, content: str}}")
        msg: dict[str, Any] = {"role": m["role"], "content": m["content"]}
        reasoning = m.get("reasoning_content")
        if reasoning is not None:
            if not isinstance(reasoning, str):
                raise MalformedResult(f"messages[{i}].reasoning_content is not a string")
            if m["role"] != "assistant":
                raise MalformedResult(f"messages[{i}] is a {m['role']} message with reasoning_content")
            msg["content"], msg["reasoning_content"] = split_think(m["content"], reasoning)
        messages.append(msg)
    problems = conversation_problems(messages)
    if problems:
        raise MalformedResult("; ".join(problems))
    return messages


def conversation_problems(messages: Sequence[Mapping[str, Any]], *, style: str = "role-content") -> list[str]:
    """Every way ``messages`` breaks the export contract: leading system message(s), then user and
    assistant alternating from user, ending with assistant; string contents; no raw ``<think>`` in
    the content of a turn that has ``reasoning_content``. Empty when it conforms."""
    role_key, text_key = ("from", "value") if style == "from-value" else ("role", "content")
    names = {v: k for k, v in FROM_NAMES.items()} if style == "from-value" else {r: r for r in FROM_NAMES}
    problems: list[str] = []
    roles = []
    for i, m in enumerate(messages):
        role = names.get(str(m.get(role_key))) if isinstance(m, Mapping) else None
        if role is None:
            problems.append(f"turn {i}: {role_key} is {m.get(role_key) if isinstance(m, Mapping) else m!r}")
            continue
        roles.append(role)
        text = m.get(text_key)
        if not isinstance(text, str):
            problems.append(f"turn {i}: {text_key} is not a string")
        elif isinstance(m.get("reasoning_content"), str) and ("<think>" in text or "</think>" in text):
            problems.append(f"turn {i}: raw <think> block left in {text_key} beside reasoning_content")
    body = roles[next((i for i, r in enumerate(roles) if r != "system"), len(roles)):]
    if not body:
        problems.append("no user turn")
    for i, role in enumerate(body):
        want = "user" if i % 2 == 0 else "assistant"
        if role != want:
            problems.append(f"roles do not alternate: {' '.join(roles)}")
            break
    if body and body[-1] != "assistant":
        problems.append("the conversation does not end with an assistant answer")
    return problems


# ------------------------------------------------------------------------------------ records


def specforge_record(row: ResultRow) -> dict[str, Any]:
    """``{"id", "status": "success", "truncated"?: true, "conversations": [{"role", "content",
    "reasoning_content"?}]}``, as SpecForge's regeneration writes a row (its validator requires
    ``status == "success"``, a non-empty string id and non-empty user and system texts). Empty
    system messages are left out; an empty assistant turn raises :class:`MalformedResult`."""
    turns = [t for t in conversation(row) if t["role"] != "system" or t["content"].strip()]
    for i, t in enumerate(turns):
        if t["role"] == "assistant" and not t["content"].strip() and not t.get("reasoning_content", "").strip():
            raise MalformedResult(f"turn {i}: the assistant answer is empty (not training data)")
    record: dict[str, Any] = {"id": row.item_id, "status": "success"}
    if row.status is Status.TRUNCATED:
        record["truncated"] = True
    record["conversations"] = turns
    return record


def sharegpt_record(row: ResultRow, style: str = "role-content") -> dict[str, Any]:
    """``{"id", "conversations": [{"role", "content", "reasoning_content"?}]}``, or with
    ``style="from-value"`` turns ``{"from", "value", "reasoning_content"?}``."""
    turns = conversation(row)
    if style == "from-value":
        turns = [{"from": FROM_NAMES[t["role"]], "value": t["content"],
                  **({"reasoning_content": t["reasoning_content"]} if "reasoning_content" in t else {})}
                 for t in turns]
    return {"id": row.item_id, "conversations": turns}


def openai_batch_record(row: ResultRow) -> dict[str, Any]:
    """One line of an OpenAI Batch API output file. Ids are derived from the item id, so a second
    export writes the same lines. ``custom_id`` is :attr:`ResultRow.join_id`: a skipped line's own
    custom_id where it had one (``id`` stays unique: it derives from the ledger's id). The body is
    the completion of the item's last assistant turn, or for a batch row (an OpenAI batch input
    line) its own request's answer, every choice with its log-probabilities as the engine sent
    them; ``system_fingerprint`` is the settings hash the result came from."""
    head = {"id": f"batch_req_{hex_id('batch_req', row.item_id)}", "custom_id": row.join_id}
    if row.status not in RESULT_STATUSES:
        code = row.error_class or ("input" if row.status is Status.SKIPPED else row.status.value)
        error = {"code": code, "message": row.last_error or row.status.value}
        return {**head, "response": None, "error": error}
    out = row.output
    if isinstance(out, Mapping) and isinstance(out.get("batch"), Mapping):
        conversation(row)  # the stored result is checked as every other (MalformedResult)
        body = batch_body(row.item_id, out, created=row.created_at, settings_hash=row.settings_hash)
    else:
        body = _last_turn_body(row, out)
    response = {"status_code": 200, "request_id": f"req_{hex_id('req', row.item_id)}", "body": body}
    return {**head, "response": response, "error": None}


def _last_turn_body(row: ResultRow, out: Any) -> dict[str, Any]:
    """The ``chat.completion`` of a conversation's last assistant turn."""
    messages = conversation(row)
    answer = messages[-1]
    turns = out.get("turns") if isinstance(out.get("turns"), list) else []
    last = turns[-1] if turns and isinstance(turns[-1], Mapping) else {}
    prompt = last.get("prompt_tokens", row.prompt_tokens) if last else row.prompt_tokens
    completion = last.get("completion_tokens", row.completion_tokens) if last else row.completion_tokens
    message = {"role": "assistant", "content": answer["content"]}
    if "reasoning_content" in answer:
        message["reasoning_content"] = answer["reasoning_content"]
    return {
        "id": f"chatcmpl-{hex_id('chatcmpl', row.item_id)}",
        "object": "chat.completion",
        "created": int(row.created_at or 0),
        "model": out.get("model") if isinstance(out.get("model"), str) else "",
        "system_fingerprint": row.settings_hash or out.get("settings_hash"),
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": last.get("finish_reason") or row.finish_reason}],
        "usage": {"prompt_tokens": prompt or 0, "completion_tokens": completion or 0,
                  "total_tokens": (prompt or 0) + (completion or 0)},
    }


def parquet_record(row: ResultRow) -> dict[str, Any]:
    """One Parquet row (see :func:`parquet_schema`); ``conversations`` is null without a result.
    ``id`` is the ledger's (unique; ``skip:<file>:<line>`` for a row skipped at ingest), ``input_id``
    the input row's own id as found, skipped rows' included (null where the row had none: an item
    known by a hash of its content, a line that was not JSON), to join the row to its input by."""
    turns = None
    model = None
    if row.status in RESULT_STATUSES:
        turns = [{"role": t["role"], "content": t["content"], "reasoning_content": t.get("reasoning_content")}
                 for t in conversation(row)]
        model = row.output.get("model") if isinstance(row.output.get("model"), str) else None
    return {"id": row.item_id, "input_id": row.raw_id if row.item is None else row.item.raw_id,
            "status": row.status.value, "conversations": turns,
            "finish_reason": row.finish_reason, "prompt_tokens": row.prompt_tokens,
            "completion_tokens": row.completion_tokens, "model": model, "settings_hash": row.settings_hash,
            "error_class": row.error_class, "error": row.last_error, "attempts": row.attempts,
            "source": row.source, "source_line": row.source_line, "created_at": row.created_at,
            "sample": row.sample}


def parquet_schema() -> Any:
    """The pyarrow schema of the Parquet export."""
    pa = _pyarrow()[0]
    turn = pa.struct([("role", pa.string()), ("content", pa.string()), ("reasoning_content", pa.string())])
    return pa.schema([
        ("id", pa.string()), ("input_id", pa.string()), ("status", pa.string()), ("conversations", pa.list_(turn)),
        ("finish_reason", pa.string()), ("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()),
        ("model", pa.string()), ("settings_hash", pa.string()), ("error_class", pa.string()),
        ("error", pa.string()), ("attempts", pa.int64()), ("source", pa.string()),
        ("source_line", pa.int64()), ("created_at", pa.float64()), ("sample", pa.int64()),
    ])


def _pyarrow(fmt: str = "parquet") -> tuple[Any, Any]:
    from harvest.campaign.outputs.export_logprobs import pyarrow_for

    return pyarrow_for(fmt)


class _NothingSelected(Exception):
    """No record was written and the caller did not accept an empty file: the temporary goes."""


# ------------------------------------------------------------------------------------ writing


@contextlib.contextmanager
def _atomic(folder: safefiles.Folder, name: str) -> Iterator[BinaryIO]:
    """Yield a new temporary file (created ``O_EXCL`` 0600 in the held ``folder``); on success fsync it
    and rename it over ``name`` there. Nothing is done by path: the mode is set on the descriptor and
    the rename is relative to the folder, so a name swapped in the folder changes nothing here."""
    folder.check_file(name)  # an existing output must be this user's own file, never a link
    tmp, fd = folder.temp(name)  # like the ledger, prompts and answers may be private
    try:
        with os.fdopen(fd, "w+b") as fh:
            yield fh
            fh.flush()
            os.fchmod(fh.fileno(), 0o600)
            os.fsync(fh.fileno())
        folder.replace(tmp, name)
    except BaseException:
        folder.unlink(tmp)
        raise
    os.fsync(folder.fd)


def _with_sample(make: Callable[[ResultRow], dict[str, Any]], fmt: str) -> Callable[[ResultRow], dict[str, Any]]:
    """Records of a run with [sampling] n > 1 carry their sample index: a ``sample`` field, and in a
    batch file the ``custom_id`` ``<id>#<sample>`` (custom ids must be unique)."""

    def wrapped(row: ResultRow) -> dict[str, Any]:
        record = make(row)
        if fmt == "openai-batch":
            record["custom_id"] = f"{row.join_id}#{row.sample}"
        else:
            record["sample"] = row.sample
        return record

    return wrapped


class _Tally:
    def __init__(self) -> None:
        self.by_status: Counter[str] = Counter()
        #: logprobs: rows written (one per sample and turn).
        self.rows = 0
        self.malformed = 0
        self.examples: list[tuple[str, str]] = []

    def build(self, row: ResultRow, make: Callable[[ResultRow], dict[str, Any]]) -> dict[str, Any] | None:
        try:
            record = make(row)
        except MalformedResult as exc:
            self.malformed += 1
            if len(self.examples) < _MALFORMED_EXAMPLES:
                self.examples.append((row.item_id, str(exc)))
            return None
        self.by_status[row.status.value] += 1
        return record


def _write_jsonl(f: TextIO, rows: Iterable[ResultRow], make: Callable[[ResultRow], dict[str, Any]],
                 tally: _Tally) -> None:
    encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    for row in rows:
        record = tally.build(row, make)
        if record is not None:
            f.write(encode(record))
            f.write("\n")


def _write_parquet(path: Path | BinaryIO, rows: Iterable[ResultRow], tally: _Tally, row_group_size: int) -> None:
    pa, pq = _pyarrow()
    schema = parquet_schema()
    batch: list[dict[str, Any]] = []
    chars = 0
    with pq.ParquetWriter(path if not isinstance(path, Path) else str(path), schema, compression="zstd") as writer:
        for row in rows:
            record = tally.build(row, parquet_record)
            if record is None:
                continue
            batch.append(record)
            chars += sum(len(t["content"]) + len(t["reasoning_content"] or "")
                         for t in record["conversations"] or ())
            if len(batch) >= row_group_size or chars >= _ROW_GROUP_CHARS:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema), row_group_size=len(batch))
                batch, chars = [], 0
        if batch:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema), row_group_size=len(batch))


def export_run(run_dir: str | Path, fmt: str, *, output: str | Path | None = None,
               statuses: str | Status | Iterable[str | Status] | None = None, sharegpt_style: str = "role-content",
               row_group_size: int = ROW_GROUP_SIZE, fetch: int = 1000, allow_empty: bool = True) -> ExportReport:
    """Write the items of ``statuses`` (default: :data:`FORMAT_DEFAULT_STATUSES`, else ``done``) from
    the run's ledger to ``output`` (default :func:`default_output`) in ``fmt``, atomically, in input
    order.

    Raises :class:`~harvest.errors.LedgerError` when ``run_dir`` holds no readable ledger and
    :class:`~harvest.errors.ConfigError` for options that do not fit (an unknown format, a status
    the format cannot hold, Parquet without pyarrow, a missing output folder). Without
    ``allow_empty`` an export that selects nothing leaves no file (``kept`` False).
    """
    wanted = selected_statuses(fmt, statuses)
    _check_options(fmt, wanted, sharegpt_style)
    if fmt in ("parquet", "logprobs"):
        _pyarrow(fmt)
    path = Path(output) if output is not None else default_output(run_dir, fmt)
    if output is not None and not path.parent.is_dir():
        raise ConfigError("harvest export options", [("--output", f"folder {path.parent} does not exist")])
    # The run folder: this user's own; an --output folder: one no other user can rename things in.
    folder = safefiles.Folder.hold(path.parent, strict=output is None)
    tally = _Tally()
    without = 0
    try:
        ledger = Ledger.open_readonly(run_dir)
    except BaseException:
        folder.close()
        raise
    try:
        rows = ledger.iter_results(wanted, fetch=fetch)
        with contextlib.suppress(_NothingSelected), _atomic(folder, path.name) as tmp:
            if fmt == "logprobs":
                from harvest.campaign.outputs.export_logprobs import write_logprobs

                tally.rows, without = write_logprobs(ledger, rows, tmp, tally.by_status)
            elif fmt == "parquet":
                _write_parquet(tmp, rows, tally, row_group_size)
            else:
                make: Callable[[ResultRow], dict[str, Any]] = {
                    "specforge": specforge_record,
                    "sharegpt": lambda row: sharegpt_record(row, sharegpt_style),
                    "openai-batch": openai_batch_record,
                }[fmt]
                if ledger.samples > 1:
                    make = _with_sample(make, fmt)
                f = io.TextIOWrapper(tmp, encoding="utf-8", newline="\n", write_through=True)
                try:
                    _write_jsonl(f, rows, make, tally)
                    f.flush()
                finally:
                    f.detach()  # the file stays open: _atomic syncs and renames it
            if not allow_empty and not sum(tally.by_status.values()):
                raise _NothingSelected  # _atomic removes the temporary; an older export stays as it was
    finally:
        ledger.close()
        folder.close()
    written = sum(tally.by_status.values())
    return ExportReport(path=path, format=fmt, written=written, by_status=dict(tally.by_status),
                        malformed=tally.malformed, malformed_examples=tuple(tally.examples),
                        kept=allow_empty or written > 0, without_logprobs=without,
                        rows=tally.rows if fmt == "logprobs" else written)


# ------------------------------------------------------------------------------------ checking


@dataclass(frozen=True)
class ExportCheck:
    """What :func:`check_export` found in an exported file."""

    records: int
    #: Every problem found (capped at 100), each naming the record's line or row.
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def _records(path: Path, fmt: str) -> Iterator[tuple[int, dict[str, Any]]]:
    if fmt == "parquet":
        pq = _pyarrow()[1]
        n = 0
        for batch in pq.ParquetFile(str(path)).iter_batches(batch_size=1000):
            for record in batch.to_pylist():
                n += 1
                yield n, record
        return
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            yield n, json.loads(line)


def check_export(path: str | Path, fmt: str, *, sharegpt_style: str = "role-content") -> ExportCheck:
    """Read an exported file back and check it: ids unique, every conversation valid
    (:func:`conversation_problems`), batch lines with exactly one of response and error.

    Streams the records, but keeps every id in a set to find repeats.
    """
    path = Path(path)
    ids: set[tuple[str, Any]] = set()
    problems: list[str] = []
    count = 0
    style = sharegpt_style if fmt == "sharegpt" else "role-content"
    for n, rec in _records(path, fmt):
        count = n
        where = f"{path.name}:{n}"
        found: list[str] = []
        key = "custom_id" if fmt == "openai-batch" else "id"
        if not isinstance(rec.get(key), str):
            found.append(f"{key} missing")
        elif (rec[key], rec.get("sample")) in ids:
            found.append(f"{key} {rec[key]!r} repeated")
        else:
            ids.add((rec[key], rec.get("sample")))
        if fmt == "openai-batch":
            response, error = rec.get("response"), rec.get("error")
            if (response is None) == (error is None):
                found.append("exactly one of response and error must be set")
            elif response is not None:
                try:
                    message = response["body"]["choices"][0]["message"]
                except (KeyError, IndexError, TypeError):
                    found.append("response.body.choices[0].message missing")
                else:
                    found += conversation_problems([{"role": "user", "content": ""}, message])
        elif rec.get("conversations") is not None:
            found += conversation_problems(rec["conversations"], style=style)
            if fmt == "specforge" and rec.get("status") != "success":
                found.append(f"status is {rec.get('status')!r}, SpecForge expects 'success'")
        elif fmt != "parquet":
            found.append("conversations missing")
        problems += [f"{where}: {p}" for p in found]
        if len(problems) >= 100:
            problems = problems[:100]
            break
    return ExportCheck(records=count, problems=tuple(problems))


__all__ = [
    "ALLOWED_STATUSES", "DEFAULT_STATUSES", "FORMATS", "FORMAT_DEFAULT_STATUSES", "FROM_NAMES", "ExportCheck", "ExportReport",
    "MalformedResult", "ROW_GROUP_SIZE", "SHAREGPT_STYLES", "check_export", "conversation",
    "conversation_problems", "default_output",
    "export_run", "openai_batch_record", "parquet_record", "parquet_schema", "parse_statuses",
    "selected_statuses", "nothing_selected",
    "sharegpt_record", "specforge_record", "split_think",
]
