"""Text harvest did not write itself, as rich shows it: as it is.

What harvest shows that it did not write itself (an engine's error, an item id, a path, a URL, a
config value, a note built from them) enters rich only through :func:`as_text`: rich reads
``[bold]``, ``[/]`` or ``[client]`` in a plain string as markup and drops it from the screen, and
an escape sequence would reach the terminal. Secrets are hidden before (``harvest.redact``).
"""

from __future__ import annotations

from rich.text import Text

from harvest.redact import escape_controls


def as_text(text: object, style: str = "", *, one_line: bool = False) -> Text:
    """``text`` for rich as it is: a :class:`rich.text.Text`, whose content rich never reads as
    markup (an engine error's ``[bold]`` or a note's ``[client]`` stays on screen), with control
    characters escaped (``one_line``: newlines and tabs too). Where text harvest did not write
    itself enters rich (a printed line, a table cell, a panel or table title), it enters as this."""
    return Text(escape_controls(str(text), one_line=one_line), style=style)


__all__ = ["as_text"]
