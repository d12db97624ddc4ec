"""The logprob shards' own folder and the trim on open: nothing outside the run folder is cut."""

from __future__ import annotations

import os
import stat

import pytest

from harvest.errors import LedgerError
from harvest.ledger.logprobs import LOGPROB_DIR, ShardStore, shard_name
from tests.realparts import require


def test_a_hard_linked_shard_is_refused_before_it_is_cut(tmp_path):
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"v" * 64)
    store = ShardStore(tmp_path / "run")
    (tmp_path / "run").mkdir()
    store.append([b"r" * 16], 0)  # shard 0, 16 bytes committed
    store.close()
    shard = tmp_path / "run" / LOGPROB_DIR / shard_name(0)
    shard.unlink()
    os.link(victim, shard)  # the shard's name now shares its bytes with a file outside
    with pytest.raises(LedgerError, match=r"not cut: a logprob shard must be this user's own regular file with "
                                          rf"one link \(uid {os.geteuid()}, 2 links\)"):
        store.trim({0: 16})
    assert victim.read_bytes() == b"v" * 64


def test_an_unregistered_or_longer_shard_is_removed_or_cut_back(tmp_path):
    (tmp_path / "run").mkdir()
    store = ShardStore(tmp_path / "run")
    store.append([b"a" * 10, b"b" * 6], 0)
    store.close()
    stray = tmp_path / "run" / LOGPROB_DIR / shard_name(7)
    stray.write_bytes(b"x" * 5)
    assert store.trim({0: 10}) == (1, 11)  # shard 7 removed (5), shard 0 cut from 16 to 10 (6)
    assert (tmp_path / "run" / LOGPROB_DIR / shard_name(0)).read_bytes() == b"a" * 10 and not stray.exists()
    assert stat.S_IMODE((tmp_path / "run" / LOGPROB_DIR).stat().st_mode) == 0o700


def test_a_logprob_folder_another_user_owns_is_refused(tmp_path):
    require("second-user", "a folder of another user's (nobody) is made with chown, which needs root")
    folder = tmp_path / "run" / LOGPROB_DIR
    folder.mkdir(parents=True, mode=0o700)
    os.chown(folder, 65534, 65534)
    with pytest.raises(LedgerError, match="the logprob folder is owned by uid 65534 with mode 0700"):
        ShardStore(tmp_path / "run").append([b"r"], 0)
    assert list(folder.iterdir()) == []
