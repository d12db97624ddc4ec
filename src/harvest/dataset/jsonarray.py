"""Split a JSON array into its top-level elements while streaming, without holding the file.

``split_array`` reads a byte stream in chunks and yields the text of each top-level element with
the line it starts on. It only tracks strings, escapes and bracket depth (a regular expression
jumps between the characters that matter), so an element whose *content* is malformed is still
delimited and can be skipped on its own while the rest of the array is read. Memory holds one
element plus one chunk.

This module never parses element content (callers do, one element at a time) and never raises for
malformed data inside the array: it yields ``Skipped`` for an empty element, a truncated array or
trailing data. It raises ``NotAnArray`` only when the stream does not start with ``[``.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from typing import BinaryIO

from harvest.dataset.records import Skipped

#: Characters that matter outside strings, inside strings, and the first non-blank character.
_OUTSIDE = re.compile(r'[\[\]{}",]')
_INSIDE = re.compile(r'["\\]')
_NON_BLANK = re.compile(r"[^ \t\r\n]")

CHUNK = 1 << 20


class NotAnArray(Exception):
    """The stream's first non-blank character is not ``[`` (it is ``first``, or "" when empty)."""

    def __init__(self, first: str):
        super().__init__(f"first character is {first!r}, not '['")
        self.first = first


class _Buffer:
    """Decoded text of the stream with absolute scanning positions and line accounting."""

    def __init__(self, stream: BinaryIO, chunk: int):
        self._stream = stream
        self._chunk = chunk
        # Undecodable bytes become lone surrogates U+DC80..U+DCFF; callers look for them per element.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
        self.text = ""
        self.eof = False
        self._line = 1  # line number at text[_line_pos]
        self._line_pos = 0

    def fill(self, keep_from: int) -> int:
        """Read one more chunk, dropping text before ``keep_from``. Returns how far positions moved."""
        self.line_at(keep_from)
        # Read at least as much as is kept: an element spanning many chunks then costs a doubling
        # buffer (linear in its size) instead of one copy of everything so far per chunk.
        data = self._stream.read(max(self._chunk, len(self.text) - keep_from))
        if not data:
            self.eof = True
        decoded = self._decoder.decode(data, final=not data)
        self.text = self.text[keep_from:] + decoded
        self._line_pos -= keep_from
        return keep_from

    def line_at(self, pos: int) -> int:
        """Line number (1-based) of position ``pos``; positions must be asked in increasing order."""
        self._line += self.text.count("\n", self._line_pos, pos)
        self._line_pos = pos
        return self._line


def split_array(stream: BinaryIO, source: str, chunk: int = CHUNK) -> Iterator[tuple[int, str] | Skipped]:
    """Yield ``(line, element_text)`` for each top-level element of the JSON array in ``stream``.

    A UTF-8 byte-order mark is ignored. Element text may contain lone surrogates U+DC80..U+DCFF
    where the file had bytes that are not UTF-8.
    """
    buf = _Buffer(stream, chunk)
    pos = 0
    bom_checked = False
    # Find the opening bracket.
    while True:
        if not bom_checked and buf.text:
            bom_checked = True
            if buf.text[0] == "\ufeff":
                pos = 1
        m = _NON_BLANK.search(buf.text, pos)
        if m:
            if m.group() != "[":
                raise NotAnArray(m.group())
            pos = m.end()
            break
        if buf.eof:
            raise NotAnArray("")
        pos -= buf.fill(len(buf.text))

    depth = 0
    in_string = False
    start: int | None = None  # start of the current element, None between elements
    after_comma = False
    closed = False
    while not closed:
        text = buf.text
        if pos >= len(text):
            if buf.eof:
                break
            keep = start if start is not None else pos
            moved = buf.fill(keep)
            pos -= moved
            if start is not None:
                start -= moved
            continue
        if in_string:
            m = _INSIDE.search(text, pos)
            if m is None:
                pos = len(text)
            elif m.group() == "\\":
                if m.start() + 1 >= len(text) and not buf.eof:
                    pos = m.start()  # the escaped character is in the next chunk
                    keep = start if start is not None else pos
                    moved = buf.fill(keep)
                    pos -= moved
                    if start is not None:
                        start -= moved
                else:
                    pos = m.start() + 2
            else:
                in_string = False
                pos = m.end()
            continue
        if start is None:
            m = _NON_BLANK.search(text, pos)
            if m is None:
                pos = len(text)
                continue
            c, p = m.group(), m.start()
            if c == "]":
                if after_comma:
                    yield Skipped(source, buf.line_at(p), "empty array element (trailing comma before ']')")
                pos, closed = p + 1, True
            elif c == ",":
                yield Skipped(source, buf.line_at(p), "empty array element (two commas in a row)")
                pos, after_comma = p + 1, True
            else:
                start = pos = p
            continue
        m = _OUTSIDE.search(text, pos)
        if m is None:
            pos = len(text)
            continue
        c, p = m.group(), m.start()
        pos = p + 1
        if c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
        elif c in "]}":
            if depth > 0:
                depth -= 1
            elif c == "]":
                yield buf.line_at(start), text[start:p].rstrip()
                start, closed = None, True
            # A stray '}' at depth 0 stays in the element; its content then fails to parse.
        elif depth == 0:  # a comma between elements
            yield buf.line_at(start), text[start:p].rstrip()
            start, after_comma = None, True

    if not closed:
        line = buf.line_at(start if start is not None else len(buf.text))
        if start is not None and depth == 0 and not in_string and buf.text[start:].strip():
            # The last element ended but the array did not: report the element and the truncation.
            yield line, buf.text[start:].rstrip()
            line = buf.line_at(len(buf.text))
        yield Skipped(source, line, "file ends inside the JSON array (no closing ']'): truncated file?")
        return
    # Anything but blanks after the closing bracket is reported once.
    while True:
        m = _NON_BLANK.search(buf.text, pos)
        if m:
            yield Skipped(source, buf.line_at(m.start()), "data after the closing ']' of the JSON array")
            return
        if buf.eof:
            return
        pos -= buf.fill(len(buf.text))


__all__ = ["CHUNK", "NotAnArray", "split_array"]
