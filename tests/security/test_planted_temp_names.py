"""Temporary names no one can plant in advance.

A file harvest replaces (an export, a report, ``progress.json``, a launch record) is written to a
temporary file beside it and renamed over it. Its name was ``.NAME.<pid>.<n>.tmp``, n < 100: another
user who planted those names for the next pids made an export fail ("no free temporary name beside
it"). The name now carries 128 random bits and is created ``O_EXCL | O_NOFOLLOW`` in the held
folder, a taken name drawn again. Here every name the old scheme could give the next 1,000 pids,
and 300 names of the new shape, are planted beside an export's target in a sticky shared folder
(as the same user: the point is prediction, not permission), each a symlink to a file of the
victim's; the export goes through, its pid among those planted for.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from harvest.dataset import Item, Message
from harvest.ledger import Completion, Ledger
from tests import harvest_process

#: Pids planted for, after the last one given out.
PIDS_AHEAD = 1000


def ledger_with_rows(run_dir: Path, n: int) -> None:
    with Ledger.open(run_dir, settings_hash="0" * 32) as ledger:
        ledger.ingest(Item(f"id{i:04d}", "data.jsonl", i + 1, (Message("user", f"question {i}"),), raw_id=f"id{i:04d}")
                      for i in range(n))
        while rows := ledger.claim(500):
            ledger.complete([Completion(r.id, {
                "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                "turns": [{"finish_reason": "stop", "prompt_tokens": 3, "completion_tokens": 1,
                           "endpoint": "http://127.0.0.1:8000", "latency_s": 0.1, "attempts": 1}],
                "model": "m", "settings_hash": "0" * 32}) for r in rows])


def next_pids(count: int) -> list[int]:
    """The ``count`` pids the kernel gives out next (in order, wrapping past ``pid_max``)."""
    last = int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    return [p if p < pid_max else 300 + (p - pid_max) for p in range(last + 1, last + 1 + count)]


def test_an_export_goes_through_beside_every_name_planted_for_the_next_pids(tmp_path):
    run_dir = tmp_path / "run"
    ledger_with_rows(run_dir, 50)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # a sticky folder anyone writes in, as /tmp
    victim = tmp_path / "victim.txt"
    victim.write_text("the victim's own file\n")
    out = shared / "out.jsonl"

    pids = next_pids(PIDS_AHEAD)
    planted = [f".{out.name}.{pid}.{n}.tmp" for pid in pids for n in range(100)]  # the old scheme, whole
    planted += [f".{out.name}.{secrets.token_hex(16)}.tmp" for _ in range(300)]   # the new shape
    try:
        for name in planted:
            os.symlink(victim, shared / name)

        env = {**os.environ, "HARVEST_STATE_DIR": str(tmp_path / "state")}
        proc = harvest_process.popen([sys.executable, "-m", "harvest", "export", str(run_dir), "--format", "sharegpt",
                                      "--output", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env, stdin=subprocess.DEVNULL)
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.pid in pids, "the export ran under a pid nothing was planted for: the test proves nothing"
        assert proc.returncode == 0, stdout + stderr
        st = out.lstat()
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        assert len(out.read_text().splitlines()) == 50
        assert victim.read_text() == "the victim's own file\n"
        # Every plant is still the link it was; nothing else was left beside the target.
        left = {p.name for p in shared.iterdir()} - {out.name}
        assert left == set(planted)
        assert all((shared / name).is_symlink() for name in planted[:: 97])
    finally:
        # 100,300 links, removed by this test (in its worker, beside the others' work) instead of by
        # pytest's controller when it rotates this session's folder out three sessions later: there
        # it held the end of a later session for 13-17 s of disk I/O (the 2-core VM)
        shutil.rmtree(shared, ignore_errors=True)


def test_a_replaced_file_draws_a_new_name_each_time(tmp_path):
    from harvest.safefiles import Folder

    with Folder.hold(tmp_path / "f", create=True) as folder:
        names = set()
        for _ in range(50):
            tmp, fd = folder.temp("progress.json")
            os.close(fd)
            folder.unlink(tmp)
            names.add(tmp)
        assert len(names) == 50
        assert all(n.startswith(".progress.json.") and n.endswith(".tmp") and len(n) == len(".progress.json.") + 36
                   for n in names)
        long = "x" * 255  # the longest name the system takes: its temporary name still fits
        tmp, fd = folder.temp(long)
        os.close(fd)
        assert len(os.fsencode(tmp)) <= 255
        folder.unlink(tmp)
