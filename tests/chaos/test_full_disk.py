"""R5: the run folder on a full disk (a 1 MiB tmpfs mounted over it; CI runs as root).

- The disk fills up during the run: `harvest run` stops with one clear error line and a non-zero
  exit code (no traceback), the ledger stays consistent (integrity_check, result <=> done/truncated)
  and keeps every result it committed; once the file system is grown, the resume completes.
- The disk is already full when the run starts (a 16 MiB tmpfs, filled): the same clear error; after
  the filler file is deleted the run completes.

The endpoint is the shared llama-server. The tmpfs is unmounted in a finally; where mounting is not
permitted (not root, or no CAP_SYS_ADMIN in a container) the tests fail in CI and skip elsewhere,
saying why (tests/realparts.py).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests import harvest_process
from tests.chaos.killer import check_after_kill, final_check, harvest_argv, read_ledger, write_data
from tests.realparts import require

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture
def small_disk(tmp_path: Path, request: pytest.FixtureRequest):
    """A small tmpfs (1 MiB, or the size the test gives as its param) mounted at tmp_path/run;
    yields (path, grow) where grow(size) remounts it bigger."""
    size = getattr(request, "param", "1m")
    mnt = tmp_path / "run"
    mnt.mkdir()
    require("root", "mounting a tmpfs over the run folder needs root")
    require("mount", "the full disk is a small tmpfs")
    require("tmpfs", "the full disk is a small tmpfs")
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mnt)],
                         capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        require("tmpfs", "the full disk is a small tmpfs", absent=f"mount -t tmpfs refused: {out.stderr.strip()}")

    def grow(size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(mnt)], check=True, timeout=30)

    try:
        yield mnt, grow
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def _job(tmp_path: Path, run_dir: Path, url: str, n: int, max_tokens: int) -> Path:
    data = write_data(tmp_path / "in.jsonl", n, duplicates=0)
    job = tmp_path / "job.toml"
    job.write_text(
        f'[data]\npath = "{data}"\nid_field = "id"\n'
        f'[sampling]\nmax_tokens = {max_tokens}\n'
        f'[client]\nendpoints = ["{url}"]\nconcurrency = 16\nhealth_deadline = 60\n'
        f'[output]\ndir = "{run_dir}"\n'
        f'[run]\nprogress_interval = 0.5\n')
    return job


def _assert_clear_error(out: subprocess.CompletedProcess[str]) -> None:
    text = out.stdout + out.stderr
    assert out.returncode == 2, text  # RELIABILITY.md: 2, the run could not go on (not 1, "finished, check failed")
    assert "Traceback" not in text and "Task exception" not in text, text
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text
    assert "disk is full" in errors[0] or "No space left" in errors[0], errors


def test_disk_fills_during_the_run_then_resume_after_space_is_freed(tmp_path, small_disk, llama_server, env):
    run_dir, grow = small_disk
    n = 1000
    job = _job(tmp_path, run_dir, llama_server.url, n, max_tokens=32)
    argv = harvest_argv("run", str(job), "--no-live")

    out = harvest_process.run(argv, capture_output=True, text=True, timeout=300, env=env)

    _assert_clear_error(out)
    view = read_ledger(run_dir)
    assert view is not None and view.ingest_complete
    assert check_after_kill(None, view) == []  # integrity_check ok, result <=> done/truncated
    assert 0 < len(view.results) < n, len(view.results)  # it got going, then the disk was full

    grow("64m")
    resumed = harvest_process.run(argv, capture_output=True, text=True, timeout=300, env=env)

    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert final_check(run_dir, n) == []
    assert check_after_kill(view, read_ledger(run_dir)) == []  # every result of the first session kept


# 16 MiB: the run after the filler is deleted must fit. The folder then holds the ledger, whose WAL
# SQLite checkpoints only after WAL_CHECKPOINT_PAGES (16,384 pages, 64 MiB; ledger/schema.py), so a
# run this small keeps every commit's pages in ledger.sqlite-wal: 15-20 KB an item measured (3-4 MB
# for 200 items, which 4 MiB no longer held), up to about 40 KB where each answer commits alone;
# beside it the -shm (32 KiB), progress/timeline/runner.json (a few KB) and report.html (~70 KB).
@pytest.mark.parametrize("small_disk", ["16m"], indirect=True)
def test_disk_already_full_at_start_then_run_after_the_filler_is_deleted(tmp_path, small_disk, llama_server,
                                                                         env):
    run_dir, _ = small_disk
    n = 200
    job = _job(tmp_path, run_dir, llama_server.url, n, max_tokens=8)
    filler = run_dir / "filler"
    with open(filler, "wb", buffering=0) as fh:  # fill the tmpfs to its last page
        for block in (65536, 4096, 512):
            try:
                while True:
                    fh.write(b"\0" * block)
            except OSError:
                pass
    argv = harvest_argv("run", str(job), "--no-live")

    out = harvest_process.run(argv, capture_output=True, text=True, timeout=120, env=env)

    _assert_clear_error(out)
    filler.unlink()
    again = harvest_process.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert final_check(run_dir, n) == []
