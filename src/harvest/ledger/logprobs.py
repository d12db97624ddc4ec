"""Token log-probabilities beside the ledger: compact binary records in append-only shard files.

One record per result (one sample of one item), holding every assistant turn of it:

    header   magic b"HLP1", turns (u32), k (u32), CRC-32 of the body (u32)
    lengths  tokens per turn (u32 each)
    body     per turn: token ids (int32[n]), their log-probabilities (float16[n]), the top-k token
             ids (int32[n*k]) and their log-probabilities (float16[n*k]), row-major per token

6 + 6k bytes per generated token (126 at k = 20) plus 16 + 4 per turn; columnar within a record, so
an export reads each array with one ``numpy.frombuffer``. Records go into ``logprobs/shard-NNNNNN.bin``
in the run folder (0700 folder, 0600 files, opened without following links), one shard per writing
ledger handle, a new one past ``SHARD_MAX`` bytes.

Commit order (the ledger does it: ``Ledger.apply`` in claims.py, through shards.py): the records
of a batch are appended and ``fdatasync``-ed first; then one SQLite transaction inserts the result
rows that reference them (shard, offset, bytes) and moves ``lp_shards.committed`` of that shard to
its new end. A crash
between the two leaves bytes past ``committed`` that no row references: opening the ledger for
writing cuts every shard back to its committed length and removes shard files no committed row ever
reached (:meth:`ShardStore.trim`). So a result and its log-probabilities are both kept or both lost.
"""

from __future__ import annotations

import os
import re
import stat
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harvest.errors import LedgerError

if TYPE_CHECKING:
    import numpy as np

LOGPROB_DIR = "logprobs"
MAGIC = b"HLP1"
_HEADER = struct.Struct("<4sIII")
#: A shard is closed and a new one begun once it holds this many bytes.
SHARD_MAX = 1 << 30
_SHARD_NAME = re.compile(r"^shard-(\d{6})\.bin$")
#: Prefix vLLM puts on a token when asked ``return_tokens_as_token_ids``.
_TOKEN_ID_PREFIX = "token_id:"


def shard_name(shard: int) -> str:
    return f"shard-{shard:06d}.bin"


def bytes_per_token(k: int) -> int:
    """Stored bytes per generated token at top-``k``: id + logprob, k ids + k logprobs."""
    return 6 + 6 * k


def record_bytes(tokens: int, k: int, turns: int = 1) -> int:
    """Bytes of one record with ``tokens`` generated tokens over ``turns`` turns at top-``k``."""
    return _HEADER.size + 4 * turns + tokens * bytes_per_token(k)


@dataclass(frozen=True)
class TurnLogprobs:
    """The log-probabilities of one assistant turn: ``n`` generated tokens, top-``k`` each."""

    token_ids: np.ndarray  # int32 (n,)
    logprobs: np.ndarray  # float16 (n,)
    top_ids: np.ndarray  # int32 (n, k); -1 where the engine sent fewer than k
    top_logprobs: np.ndarray  # float16 (n, k); -inf where the engine sent fewer than k

    @property
    def k(self) -> int:
        return int(self.top_ids.shape[1])

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])


def _token_id(entry: Mapping[str, Any], where: str) -> int:
    """The id of one logprob entry: llama-server's ``id``, or vLLM's ``token_id:N`` token."""
    tid = entry.get("id")
    if isinstance(tid, int):
        return tid
    token = entry.get("token")
    if isinstance(token, str) and token.startswith(_TOKEN_ID_PREFIX):
        try:
            return int(token[len(_TOKEN_ID_PREFIX):])
        except ValueError:
            pass
    raise ValueError(f"{where}: the server sent no token id (token {token!r}); harvest stores ids, "
                     "which vLLM sends with return_tokens_as_token_ids and llama-server as 'id'")


def from_openai(logprobs: Any, k: int) -> TurnLogprobs:
    """Parse an OpenAI-style ``choice.logprobs`` (``{"content": [{token, logprob, top_logprobs}]}``):
    each token's candidates sorted by log-probability, the k highest kept. vLLM lists the sampled
    token first, so harvest asks one more than k (``campaign/run/generate.py`` ``logprobs_to_ask``)
    and the sorted top k is the true top k, whatever was sampled."""
    import numpy as np  # here: a ledger opened without logprobs (status, stop) needs no numpy

    if not isinstance(logprobs, Mapping) or not isinstance(logprobs.get("content"), list):
        raise ValueError("the server sent no logprobs.content although logprobs were asked for")
    content = logprobs["content"]
    fast = _from_vllm(content, k)
    if fast is not None:
        return fast
    n = len(content)
    ids = np.empty(n, dtype=np.int32)
    lps = np.empty(n, dtype=np.float32)
    top_ids = np.full((n, k), -1, dtype=np.int32)
    top_lps = np.full((n, k), -np.inf, dtype=np.float32)
    for i, entry in enumerate(content):
        ids[i] = _token_id(entry, f"logprobs token {i}")
        lps[i] = entry["logprob"]
        candidates: dict[int, float] = {}
        for j, top in enumerate(entry.get("top_logprobs") or ()):
            candidates.setdefault(_token_id(top, f"logprobs token {i} top {j}"), float(top["logprob"]))
        best = sorted(candidates.items(), key=lambda c: -c[1])[:k]
        for j, (token, lp) in enumerate(best):
            top_ids[i, j] = token
            top_lps[i, j] = lp
    return TurnLogprobs(ids, lps.astype(np.float16), top_ids, top_lps.astype(np.float16))


def _from_vllm(content: list[Any], k: int) -> TurnLogprobs | None:
    """The common case in bulk (vLLM ``token_id:N`` tokens, the same m >= k candidates per token):
    lists built by comprehension and converted once, each row sorted by log-probability and cut to
    k; None when anything differs (the general path)."""
    import numpy as np

    cut = len(_TOKEN_ID_PREFIX)
    try:
        tops = [e["top_logprobs"] for e in content]
        m = len(tops[0]) if tops else k
        if m < k or any(len(t) != m for t in tops):
            return None
        tokens = [e["token"] for e in content]
        top_tokens = [x["token"] for t in tops for x in t]
        if not all(t.startswith(_TOKEN_ID_PREFIX) for t in tokens) or not all(
                t.startswith(_TOKEN_ID_PREFIX) for t in top_tokens):
            return None
        n = len(content)
        ids = np.array([int(t[cut:]) for t in tokens], dtype=np.int32)
        lps = np.array([e["logprob"] for e in content], dtype=np.float32).astype(np.float16)
        top_ids = np.array([int(t[cut:]) for t in top_tokens], dtype=np.int32).reshape(n, m)
        top_lps = np.array([x["logprob"] for t in tops for x in t], dtype=np.float64).reshape(n, m)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    ordered = np.sort(top_ids, axis=1)
    if m > 1 and bool((ordered[:, 1:] == ordered[:, :-1]).any()):
        return None  # a token listed twice: the general path keeps its first
    order = np.argsort(-top_lps, axis=1, kind="stable")[:, :k]
    return TurnLogprobs(ids, lps, np.take_along_axis(top_ids, order, axis=1),
                        np.take_along_axis(top_lps, order, axis=1).astype(np.float16))


def encode(turns: Sequence[TurnLogprobs], k: int) -> bytes:
    """One record (every turn of one sample)."""
    import numpy as np

    parts = [struct.pack(f"<{len(turns)}I", *(len(t) for t in turns))]
    for t in turns:
        if t.top_ids.shape[1] != k:
            raise ValueError(f"top-k width {t.top_ids.shape[1]} != {k}")
        parts += [np.ascontiguousarray(t.token_ids, "<i4").tobytes(),
                  np.ascontiguousarray(t.logprobs, "<f2").tobytes(),
                  np.ascontiguousarray(t.top_ids, "<i4").tobytes(),
                  np.ascontiguousarray(t.top_logprobs, "<f2").tobytes()]
    body = b"".join(parts)
    return _HEADER.pack(MAGIC, len(turns), k, zlib.crc32(body)) + body


def decode(buf: bytes, where: str = "logprob record") -> list[TurnLogprobs]:
    """The turns of one record; :class:`LedgerError` when it is not one (or its checksum fails)."""
    import numpy as np

    if len(buf) < _HEADER.size:
        raise LedgerError(f"{where}: {len(buf)} bytes, shorter than a record header")
    magic, turns, k, crc = _HEADER.unpack_from(buf)
    body = memoryview(buf)[_HEADER.size:]
    if magic != MAGIC or zlib.crc32(body) != crc:
        raise LedgerError(f"{where}: not a valid logprob record (bad magic or checksum)")
    lengths = struct.unpack_from(f"<{turns}I", body)
    pos = 4 * turns
    out = []
    for n in lengths:
        def take(dtype: str, count: int) -> np.ndarray:
            nonlocal pos
            arr = np.frombuffer(body, dtype=dtype, count=count, offset=pos)
            pos += arr.nbytes
            return arr
        ids = take("<i4", n)
        lps = take("<f2", n)
        top_ids = take("<i4", n * k).reshape(n, k)
        top_lps = take("<f2", n * k).reshape(n, k)
        out.append(TurnLogprobs(ids, lps, top_ids, top_lps))
    return out


def _open_dir(path: Path, shown: Path) -> None:
    """Make the logprob folder (0700) or check the one there: a folder (no link), this user's own,
    writable by nobody else (``shown``: its path as messages name it)."""
    if not os.path.lexists(path):
        path.mkdir(mode=0o700)
        os.chmod(path, 0o700)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise LedgerError(f"{shown}: the logprob folder is not a folder (a link or a file)")
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise LedgerError(f"{shown}: the logprob folder is owned by uid {st.st_uid} with mode "
                          f"{stat.S_IMODE(st.st_mode):04o}; harvest writes only in a folder of its own (0700)")


def _check_shard(fd: int, path: str) -> None:
    """Before a shard is cut: this user's own regular file with one link (a hard link to another
    file would be cut with it)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
        raise LedgerError(f"{path}: not cut: a logprob shard must be this user's own regular file with one "
                          f"link (uid {st.st_uid}, {st.st_nlink} links)")


class ShardStore:
    """The run's logprob shards: append (the ledger's writing thread), read, trim on open."""

    def __init__(self, run_dir: str | Path, shown: str | Path | None = None):
        self.dir = Path(run_dir) / LOGPROB_DIR
        #: The folder as messages name it (``run_dir`` may be a path through a held descriptor).
        self.shown = Path(shown if shown is not None else run_dir) / LOGPROB_DIR
        self._fd: int | None = None
        self._shard: int | None = None
        self._end = 0

    def trim(self, committed: Mapping[int, int]) -> tuple[int, int]:
        """Cut every shard back to the bytes committed rows cover; remove unregistered shards.
        Returns (files removed, bytes cut)."""
        removed = cut = 0
        if not os.path.lexists(self.dir):
            return 0, 0
        _open_dir(self.dir, self.shown)  # a link, a file, a folder others can write in: refused before any launch
        for entry in os.scandir(self.dir):
            m = _SHARD_NAME.match(entry.name)
            if m is None or not entry.is_file(follow_symlinks=False):
                continue
            shard = int(m.group(1))
            size = entry.stat(follow_symlinks=False).st_size
            keep = committed.get(shard)
            try:
                if keep is None:
                    os.unlink(entry.path)
                    removed += 1
                    cut += size
                elif size > keep:
                    fd = os.open(entry.path, os.O_WRONLY | os.O_NOFOLLOW)
                    try:
                        _check_shard(fd, entry.path)
                        os.ftruncate(fd, keep)
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                    cut += size - keep
                elif size < keep:
                    raise LedgerError(f"{entry.path}: {size} bytes, but committed results reference {keep}"
                                      " (the shard was cut or replaced outside harvest)")
            except OSError as exc:
                raise LedgerError(f"{entry.path}: cannot trim the logprob shard: {exc.strerror or exc}") from None
        return removed, cut

    def append(self, records: Sequence[bytes], first_free: int) -> list[tuple[int, int]]:
        """Append ``records`` to the current shard (a new one, numbered from ``first_free``, when there
        is none or it is full) and fdatasync it. Returns ``(shard, offset)`` per record; the shard's
        new end is :attr:`end`."""
        try:
            if self._fd is None or self._end >= SHARD_MAX:
                self.close()
                _open_dir(self.dir, self.shown)
                shard = max(first_free, (self._shard + 1) if self._shard is not None else 0)
                path = self.dir / shard_name(shard)
                self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                self._shard, self._end = shard, 0
            assert self._shard is not None
            refs = []
            offset = self._end
            for rec in records:
                refs.append((self._shard, offset))
                offset += len(rec)
            data = b"".join(records)
            written = os.pwrite(self._fd, data, self._end)
            while written < len(data):  # a short write: go on where it stopped
                written += os.pwrite(self._fd, data[written:], self._end + written)
            os.fdatasync(self._fd)
            self._end = offset
            return refs
        except OSError as exc:
            raise LedgerError(f"{self.dir}: cannot write logprobs: {exc.strerror or exc}") from None

    @property
    def end(self) -> int:
        return self._end

    def read(self, shard: int, offset: int, length: int) -> list[TurnLogprobs]:
        path = self.dir / shard_name(shard)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                buf = os.pread(fd, length, offset)
            finally:
                os.close(fd)
        except OSError as exc:
            raise LedgerError(f"{path}: cannot read logprobs: {exc.strerror or exc}") from None
        return decode(buf, f"{path} at {offset}")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


__all__ = ["LOGPROB_DIR", "SHARD_MAX", "ShardStore", "TurnLogprobs", "bytes_per_token", "decode", "encode",
           "from_openai", "record_bytes", "shard_name"]
