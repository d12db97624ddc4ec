"""Text the model or another user wrote reaches the page and the terminal as it reads: a
right-to-left override (U+202E) or an isolate in an answer quoted by an error message, an item id or
a skipped row is shown as ``\\u202e``, never as the character that reorders what follows it; text in
a right-to-left script is left as it is."""

from __future__ import annotations

from harvest.dataset import Item, Message
from harvest.ledger import Ledger
from harvest.redact import escape_controls
from harvest.report import render_report

RLO, LRI = "\u202e", "\u2066"


def test_an_override_in_an_answer_is_shown_escaped_in_the_report(tmp_path):
    run = tmp_path / "run"
    with Ledger.open(run, settings_hash="h", meta={"job": {}}) as ledger:
        ledger.ingest(iter([Item(f"id{RLO}1", "d.jsonl", 1, (Message("user", "hi"),)),
                            Item("id2", "d.jsonl", 2, (Message("user", "ho"),))]))
        ledger.claim(2)
        ledger.fail(f"id{RLO}1", f"HTTP 400: the answer 'cod.{RLO}exe' is refused {LRI}x", "http_400")
        ledger.fail("id2", "HTTP 400: שלום", "http_400")
    page, _ = render_report(run)
    assert RLO not in page and LRI not in page
    assert "cod.\\u202eexe" in page and "id\\u202e1" in page and "\\u2066x" in page
    assert "שלום" in page
    assert escape_controls(f"a{RLO}b\x1b[2J") == "a\\u202eb\\x1b[2J"
