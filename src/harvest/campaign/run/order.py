"""Prefix-aware send order: claimed items that share a prompt prefix go out close together.

Engines reuse a cached prefix only while it is still cached and, for the cheapest hit, when the
requests that share it arrive close together (vLLM admits its waiting requests first come, first
served; SGLang's longest-prefix ordering falls back to FCFS above 128 queued requests). A shuffled
dataset of 40 system prompts x 25 questions sends each prompt's questions minutes apart in FIFO.

The ledger still claims oldest input first (``Ledger.claim``); what changes is the order in which
the claimed rows, already marked running, are handed to the client. :class:`PrefixOrder` holds
them and hands out next:

1. a row whose prefix key was sent recently (the most recent such key first), so a group in the
   window goes out back to back;
2. otherwise the oldest row: with nothing to share, the order is FIFO, at the cost of a look at a
   few recent keys per row;
3. but never passes over the oldest row more than ``patience`` times: an item cannot starve
   behind a prefix that keeps coming.

Grouping needs several rows of a prefix in the window at once: a window of twice the client's
capacity over a shuffled dataset of 40 prefixes holds one or two rows of each, so the order could
only pass them on as FIFO would. Once the rows claimed show that they share prefixes out of order
(at least ``SHARED_SHARE`` of the last ``SHARED_SAMPLE`` rows added had a key seen before, other than
the key of the row just before them), :meth:`PrefixOrder.depth` asks the dispatch to hold up to
``LOOKAHEAD`` rows. While nothing is shared, or what is shared already comes grouped (one system
prompt for every row, a dataset sorted by prompt), the window stays the client's own: the order is
FIFO, and nothing is claimed further ahead.

Nothing about a row changes but the moment it is sent: exactly once, resume (rows held here are
``running`` in the ledger, released with the in-flight ones; a killed session's are recovered to
pending by the next) and the ledger's claim order (oldest pending input first) stand.

:func:`prefix_key` names what an item shares: its system prompt when it has one, else the head of
its first message (up to ``PREFIX_CHARS``, at most half of it; under ``2 x MIN_SHARED``
characters the whole message: a short prompt is its own key). The same key routes its requests to one endpoint (``client/endpoints.py``).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from collections.abc import Iterable

from harvest.dataset.records import Item
from harvest.ledger import ItemRow

#: Characters of the first message that name its prefix when there is no system prompt.
PREFIX_CHARS = 1024
#: A first message shorter than twice this is its own key (a shorter shared head is not worth a
#: cache block: vLLM caches whole blocks of 16 tokens).
MIN_SHARED = 128
#: Rows held at most (claimed, not sent) once the claimed rows share prefixes.
LOOKAHEAD = 2048
#: The last rows added that tell whether the data shares prefixes, and the share of them that must
#: repeat a key seen before (in the last ``SEEN_KEYS`` keys) for the deeper window.
SHARED_SAMPLE = 256
SHARED_SHARE = 0.125
SEEN_KEYS = 8192


def prefix_key(item: Item) -> str:
    """A short hash of what ``item``'s requests share with others: see the module docstring."""
    system = item.system
    if system:
        text = "s\0" + system
    else:
        first = next((m.content for m in item.messages if m.content), "")
        head = first if len(first) < 2 * MIN_SHARED else first[:min(PREFIX_CHARS, len(first) // 2)]
        text = "u\0" + head
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


class PrefixOrder:
    """Claimed rows waiting to be sent, handed out prefix-aware (see the module docstring)."""

    def __init__(self, *, recent: int = 8, patience: int = 256, enabled: bool = True):
        """``enabled`` False: claim order (FIFO), as with ``[run] prefix_order = false``."""
        if recent < 1 or patience < 1:
            raise ValueError("recent and patience must be >= 1")
        self.enabled = enabled
        self._recent_max = recent
        self._patience = patience
        self._seq = 0
        #: seq -> (key, row), in claim order.
        self._fifo: OrderedDict[int, tuple[str, ItemRow]] = OrderedDict()
        #: key -> seqs of its rows still held, in claim order.
        self._groups: dict[str, deque[int]] = {}
        #: Keys sent most recently, the most recent last.
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._passed = 0
        #: Keys of the rows added lately (an LRU), and whether each of the last rows repeated one.
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._repeats: deque[bool] = deque(maxlen=SHARED_SAMPLE)
        self._last_added: str | None = None

    def __len__(self) -> int:
        return len(self._fifo)

    def add(self, rows: Iterable[ItemRow]) -> None:
        """Hold ``rows`` (in claim order)."""
        for row in rows:
            key = prefix_key(row.item)
            self._repeats.append(key != self._last_added and key in self._seen)  # a run of one key: FIFO groups it
            self._last_added = key
            self._seen.pop(key, None)
            self._seen[key] = None
            if len(self._seen) > SEEN_KEYS:
                self._seen.popitem(last=False)
            self._seq += 1
            self._fifo[self._seq] = (key, row)
            self._groups.setdefault(key, deque()).append(self._seq)

    def sharing(self) -> bool:
        """True when the rows added lately share prefixes out of order (see the module docstring)."""
        added = len(self._repeats)
        return added >= 16 and sum(self._repeats) >= SHARED_SHARE * added

    def depth(self, window: int) -> int:
        """How many rows to hold, claimed and not yet sent (in flight included), for a client whose
        own claim window is ``window``: deeper, up to ``LOOKAHEAD``, while the rows share prefixes."""
        return max(window, LOOKAHEAD) if self.enabled and self.sharing() else window

    def pop(self) -> ItemRow:
        """The next row to send. IndexError when none is held."""
        if not self._fifo:
            raise IndexError("no row held")
        oldest = next(iter(self._fifo))
        seq = oldest
        if self.enabled and self._passed < self._patience:
            for key in reversed(self._recent):
                group = self._groups.get(key)
                if group:
                    seq = group[0]
                    break
        self._passed = self._passed + 1 if seq != oldest else 0
        key, row = self._fifo.pop(seq)
        group = self._groups[key]
        if group[0] == seq:
            group.popleft()
        else:
            group.remove(seq)
        if not group:
            del self._groups[key]
        self._recent.pop(key, None)
        self._recent[key] = None
        while len(self._recent) > self._recent_max:
            self._recent.popitem(last=False)
        return row

    def drain(self) -> list[tuple[str, int]]:
        """Every held row's ledger key (item id, sample), in claim order; nothing is held afterwards."""
        ids = [row.key for _, row in self._fifo.values()]
        self._fifo.clear()
        self._groups.clear()
        self._passed = 0
        return ids


__all__ = ["LOOKAHEAD", "PREFIX_CHARS", "PrefixOrder", "prefix_key"]
