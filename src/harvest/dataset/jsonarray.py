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
    where the file had bytes that are not UTF-8. The steps: find the opening bracket, cut the
    elements (:class:`_Elements`), then report a truncated array or data after its end.
    """
    buf = _Buffer(stream, chunk)
    scan = _Elements(buf, source, _opening_bracket(buf))
    yield from scan.elements()
    if not scan.closed:
        yield from scan.truncated()
        return
    yield from _after_the_array(buf, source, scan.pos)


def _opening_bracket(buf: _Buffer) -> int:
    """The position just after the array's ``[`` (a byte-order mark before it is skipped)."""
    pos = 0
    bom_checked = False
    while True:
        if not bom_checked and buf.text:
            bom_checked = True
            if buf.text[0] == "\ufeff":
                pos = 1
        m = _NON_BLANK.search(buf.text, pos)
        if m:
            if m.group() != "[":
                raise NotAnArray(m.group())
            return m.end()
        if buf.eof:
            raise NotAnArray("")
        pos -= buf.fill(len(buf.text))


class _Elements:
    """Cuts the top-level elements out of the buffer, one state per step: inside a string, between
    elements, inside an element (brackets counted)."""

    def __init__(self, buf: _Buffer, source: str, pos: int):
        self.buf, self.source, self.pos = buf, source, pos
        self.depth = 0
        self.in_string = False
        self.start: int | None = None  # start of the current element, None between elements
        self.after_comma = False
        self.closed = False

    def elements(self) -> Iterator[tuple[int, str] | Skipped]:
        while not self.closed:
            if self.pos >= len(self.buf.text):
                if self.buf.eof:
                    return
                self._refill()
            elif self.in_string:
                self._string()
            elif self.start is None:
                yield from self._between()
            else:
                yield from self._element()

    def _refill(self) -> None:
        """Read on, keeping the current element (or the position) in the buffer."""
        moved = self.buf.fill(self.start if self.start is not None else self.pos)
        self.pos -= moved
        if self.start is not None:
            self.start -= moved

    def _string(self) -> None:
        text = self.buf.text
        m = _INSIDE.search(text, self.pos)
        if m is None:
            self.pos = len(text)
        elif m.group() == "\\":
            if m.start() + 1 >= len(text) and not self.buf.eof:
                self.pos = m.start()  # the escaped character is in the next chunk
                self._refill()
            else:
                self.pos = m.start() + 2
        else:
            self.in_string = False
            self.pos = m.end()

    def _between(self) -> Iterator[Skipped]:
        m = _NON_BLANK.search(self.buf.text, self.pos)
        if m is None:
            self.pos = len(self.buf.text)
            return
        c, p = m.group(), m.start()
        if c == "]":
            if self.after_comma:
                yield Skipped(self.source, self.buf.line_at(p), "empty array element (trailing comma before ']')")
            self.pos, self.closed = p + 1, True
        elif c == ",":
            yield Skipped(self.source, self.buf.line_at(p), "empty array element (two commas in a row)")
            self.pos, self.after_comma = p + 1, True
        else:
            self.start = self.pos = p

    def _element(self) -> Iterator[tuple[int, str]]:
        text = self.buf.text
        m = _OUTSIDE.search(text, self.pos)
        if m is None:
            self.pos = len(text)
            return
        c, p = m.group(), m.start()
        self.pos = p + 1
        if c == '"':
            self.in_string = True
        elif c in "[{":
            self.depth += 1
        elif c in "]}":
            if self.depth > 0:
                self.depth -= 1
            elif c == "]":
                assert self.start is not None
                yield self.buf.line_at(self.start), text[self.start:p].rstrip()
                self.start, self.closed = None, True
            # A stray '}' at depth 0 stays in the element; its content then fails to parse.
        elif self.depth == 0:  # a comma between elements
            assert self.start is not None
            yield self.buf.line_at(self.start), text[self.start:p].rstrip()
            self.start, self.after_comma = None, True

    def truncated(self) -> Iterator[tuple[int, str] | Skipped]:
        """The file ended inside the array: its last complete element, then the truncation."""
        buf, start = self.buf, self.start
        line = buf.line_at(start if start is not None else len(buf.text))
        if start is not None and self.depth == 0 and not self.in_string and buf.text[start:].strip():
            # The last element ended but the array did not: report the element and the truncation.
            yield line, buf.text[start:].rstrip()
            line = buf.line_at(len(buf.text))
        yield Skipped(self.source, line, "file ends inside the JSON array (no closing ']'): truncated file?")


def _after_the_array(buf: _Buffer, source: str, pos: int) -> Iterator[Skipped]:
    """Anything but blanks after the closing bracket is reported once."""
    while True:
        m = _NON_BLANK.search(buf.text, pos)
        if m:
            yield Skipped(source, buf.line_at(m.start()), "data after the closing ']' of the JSON array")
            return
        if buf.eof:
            return
        pos -= buf.fill(len(buf.text))


__all__ = ["CHUNK", "NotAnArray", "split_array"]
