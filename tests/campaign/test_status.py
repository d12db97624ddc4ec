"""`run_status` on real ledgers: counts that add up to the input, rates from progress.json or from
the ledger, the runner measured (alive, gone, pid reused), ETA, last errors, and a run folder
without progress.json or while a writer holds the ledger."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harvest.campaign.outputs.progress import PROGRESS_FILE
from harvest.campaign.outputs.status import ledger_rate, read_progress, run_status
from harvest.errors import LedgerError
from harvest.ledger import Completion, Ledger, Status
from tests.campaign.test_export import SETTINGS, build_run, item, output

ME = psutil.Process()


def write_progress(run_dir: Path, **fields) -> None:
    now = time.time()
    doc = {"started_at": ME.create_time() + 0.5, "updated_at": now, "pid": os.getpid(), "state": "running",
           "done_this_session": 7, "gen_tokens_per_s": 900.0, "prompt_tokens_per_s": 2500.0,
           "items_per_s": 2.0, "in_flight": 3, "errors_by_class": {"http_400": 1},
           "server": {"running": 3.0, "waiting": 0.0}}
    doc.update(fields)
    (run_dir / PROGRESS_FILE).write_text(json.dumps(doc))


def dead_pid() -> int:
    """The pid of a process that ran and exited (one not reused at once by another: tried again)."""
    for _ in range(20):
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        proc.wait(timeout=30)
        if not psutil.pid_exists(proc.pid):
            return proc.pid
    raise AssertionError("20 exited processes' pids were all reused at once")


@pytest.fixture
def running_run(tmp_path: Path) -> tuple[Path, dict[str, list[str]]]:
    run_dir = tmp_path / "run"
    return run_dir, build_run(run_dir, finished=False)


def test_counts_add_up_to_the_unique_input(running_run):
    run_dir, ids = running_run
    st = run_status(run_dir)
    assert {s.value: n for s, n in st.counts.items()} == {s: len(v) for s, v in ids.items()}
    assert sum(st.counts.values()) == st.totals.unique == 13
    assert (st.totals.input_rows, st.totals.duplicates, st.skipped) == (14, 1, 1)
    assert st.settled == 10 and st.remaining == 3
    assert not st.totals.ok and any("2 pending and 1 running" in p for p in st.totals.problems)
    assert st.settings_hashes == (SETTINGS,)


def test_finished_run_passes_the_totals_check_and_has_nothing_left(tmp_path):
    run_dir = tmp_path / "run"
    build_run(run_dir)
    write_progress(run_dir, state="finished")
    st = run_status(run_dir)
    assert st.totals.ok, st.totals.describe()
    assert st.totals.describe().startswith("done 6 + truncated 1 + failed 2 + skipped 1 = 10 of 10")
    assert st.eta_s == 0.0 and st.remaining == 0
    assert st.runner.alive is True and st.runner.recorded_state == "finished"
    assert st.throughput.source == "ledger"  # a finished session's rates are not live


def test_without_progress_json_rates_come_from_the_ledger(running_run):
    run_dir, ids = running_run
    assert not (run_dir / PROGRESS_FILE).exists()
    st = run_status(run_dir)
    assert st.progress is None
    tp = st.throughput
    assert tp.source == "ledger" and tp.results_in_window == len(ids["done"]) + len(ids["truncated"])
    assert tp.items_per_s == pytest.approx(tp.results_in_window / tp.window_s)
    assert tp.gen_tokens_per_s and tp.gen_tokens_per_s > 0
    # An hour later the same results are outside the window: no rate, no ETA.
    later = run_status(run_dir, now=time.time() + 3600)
    assert later.throughput.source == "none" and later.throughput.items_per_s is None
    assert later.eta_s is None


@pytest.mark.realpart("proc-locks", "the ledger's lock is seen in /proc/locks")
def test_without_progress_json_the_ledger_lock_tells_whether_a_runner_has_the_run(running_run):
    run_dir, _ = running_run
    closed = run_status(run_dir)  # the builder closed its ledger: nobody holds the lock
    assert closed.runner.alive is False and closed.runner.source == "ledger.lock"
    assert closed.throughput.items_per_s and closed.eta_s is None  # nobody is working on it
    with Ledger.open(run_dir, settings_hash=SETTINGS) as writer:
        held = run_status(run_dir)
        assert writer.recovered == 1  # reopening for writing put the running item back
    assert held.runner.alive is True and held.runner.pid == os.getpid()
    assert held.throughput.source == "ledger" and held.remaining == 3
    assert held.eta_s == pytest.approx(3 / held.throughput.items_per_s)


def test_status_reads_while_a_writer_holds_the_ledger(running_run):
    run_dir, _ = running_run
    with Ledger.open(run_dir, settings_hash=SETTINGS) as ledger:
        rows = ledger.claim(10)
        assert {r.id for r in rows} == {"wait0", "wait1", "wait2"}
        ledger.complete([Completion(r.id, output(r.item, ["ok"])) for r in rows])
        st = run_status(run_dir)
    assert st.counts[Status.DONE] == 9 and st.remaining == 0 and st.totals.ok


def test_fresh_progress_json_gives_the_live_rates(running_run):
    run_dir, _ = running_run
    write_progress(run_dir)
    st = run_status(run_dir)
    assert st.runner.alive is True and st.runner.pid == os.getpid() and st.runner.source == "progress.json"
    tp = st.throughput
    assert (tp.source, tp.items_per_s, tp.gen_tokens_per_s, tp.prompt_tokens_per_s) == (
        "progress", 2.0, 900.0, 2500.0)
    assert st.eta_s == pytest.approx(3 / 2.0)
    assert st.progress is not None and st.progress.in_flight == 3 and st.progress.server_running == 3.0


def test_stale_progress_json_is_not_used_for_rates(running_run):
    run_dir, _ = running_run
    write_progress(run_dir, updated_at=time.time() - 600)
    st = run_status(run_dir)
    assert st.runner.alive is True and st.throughput.source == "ledger"


def test_a_reused_pid_is_not_taken_for_the_runner(running_run):
    run_dir, _ = running_run
    # This process was created after the recorded start: it cannot be the runner of that session.
    write_progress(run_dir, started_at=ME.create_time() - 3600)
    st = run_status(run_dir)
    assert st.runner.alive is False and "another process" in st.runner.detail
    assert st.throughput.source == "ledger" and st.eta_s is None
    assert any("runner is gone" in n for n in st.notes)


def test_a_dead_runner_is_reported_gone(running_run):
    run_dir, _ = running_run
    write_progress(run_dir, pid=dead_pid())
    st = run_status(run_dir)
    assert st.runner.alive is False and "is gone" in st.runner.detail
    assert st.eta_s is None and any("crashed" in n for n in st.notes)


def test_unreadable_progress_json_falls_back_to_the_ledger(running_run):
    run_dir, ids = running_run
    (run_dir / PROGRESS_FILE).write_text('{"state": "runn')
    assert read_progress(run_dir)[0] is None
    st = run_status(run_dir)
    assert st.progress is None and st.throughput.source == "ledger"
    assert any("progress.json is not JSON" in n for n in st.notes)
    assert sum(st.counts.values()) == sum(len(v) for v in ids.values())


def test_last_errors_name_id_class_and_message_newest_first(running_run):
    run_dir, _ = running_run
    st = run_status(run_dir)
    assert st.failed_by_class == {"http_400": 1, "http_422": 1}
    assert [(e.item_id, e.error_class, e.message) for e in st.last_errors] == [
        ("bad422", "http_422", "HTTP 422: unprocessable"),
        ("bad400", "http_400", "HTTP 400: prompt is too long for the context"),
    ]
    assert [e.item_id for e in run_status(run_dir, errors_limit=1).last_errors] == ["bad422"]


def test_ledger_rate_spans_the_session_when_it_started_inside_the_window(tmp_path):
    run_dir = tmp_path / "run"
    items = [item(f"i{k}", k + 1, ("user", f"q{k}")) for k in range(4)]
    with Ledger.open(run_dir, settings_hash=SETTINGS) as ledger:
        ledger.ingest(items)
        ledger.claim(4)
        ledger.complete([Completion(i.id, output(i, ["a"]), prompt_tokens=10, completion_tokens=50)
                         for i in items])
        committed = time.time()
    with Ledger.open_readonly(run_dir) as ledger:
        rate = ledger_rate(ledger, now=committed + 15, window_s=600, started_at=committed - 5)
        assert (rate.source, rate.results_in_window) == ("ledger", 4)
        assert rate.window_s == pytest.approx(20, abs=0.5)
        assert rate.items_per_s == pytest.approx(4 / 20, rel=0.05)
        assert rate.gen_tokens_per_s == pytest.approx(200 / 20, rel=0.05)
        assert rate.prompt_tokens_per_s == pytest.approx(40 / 20, rel=0.05)
        # A session start before the window: the window bounds the span.
        wide = ledger_rate(ledger, now=committed + 15, window_s=60, started_at=committed - 3600)
        assert wide.window_s == pytest.approx(60, abs=0.5)


def test_not_a_run_folder_is_an_error_naming_the_path(tmp_path):
    with pytest.raises(LedgerError, match=str(tmp_path)):
        run_status(tmp_path)
    (tmp_path / "ledger.sqlite").write_text("not a database")
    with pytest.raises(LedgerError, match=str(tmp_path)):
        run_status(tmp_path)


def test_an_interrupted_ingest_is_said(tmp_path):
    run_dir = tmp_path / "run"

    def rows_then_crash():
        for k in range(3):
            yield item(f"i{k}", k + 1, ("user", f"q{k}"))
        raise KeyboardInterrupt  # the run was stopped while it read its dataset

    with Ledger.open(run_dir, settings_hash=SETTINGS) as ledger, pytest.raises(KeyboardInterrupt):
        ledger.ingest(rows_then_crash(), batch_size=2)
    st = run_status(run_dir)
    assert not st.totals.ingest_complete and st.totals.unique == 2 and st.counts[Status.PENDING] == 2
    assert st.eta_s != 0.0  # more input may come: not "nothing left"
    assert any("not fully ingested" in n for n in st.notes)


def test_auto_concurrency_targets_pass_from_progress_json_to_status_json(running_run):
    from harvest.cli.status import status_payload

    run_dir, _ = running_run
    write_progress(run_dir, concurrency_targets={"http://127.0.0.1:8000": 24, "http://127.0.0.1:8001": 4})
    st = run_status(run_dir)
    assert st.progress is not None
    assert dict(st.progress.concurrency_targets) == {"http://127.0.0.1:8000": 24, "http://127.0.0.1:8001": 4}
    assert status_payload(st)["progress"]["concurrency_targets"] == {"http://127.0.0.1:8000": 24,
                                                                    "http://127.0.0.1:8001": 4}
    write_progress(run_dir)  # a fixed concurrency writes none
    assert status_payload(run_status(run_dir))["progress"]["concurrency_targets"] == {}


def test_why_each_level_is_where_it_is_passes_from_the_steering_to_status_json(running_run, tmp_path):
    """The level's reason, from the controller (``Target.why``) through progress.json (written as the
    dispatch writes it) to ``harvest status --json``; a progress.json of an older harvest has none."""
    from harvest.campaign.outputs.progress import Progress
    from harvest.cli.status import status_payload
    from harvest.client.steer import Target

    run_dir, _ = running_run
    targets = (Target("http://127.0.0.1:8000", 1024, "start", "initial", None, False,
                      why="engine capacity 1024 from /props"),
               Target("http://127.0.0.1:8001", 512, "backoff", "latency", 900.0, False,
                      why="ceiling: latency x2.4 without gain at 1024"))
    progress = Progress(run_dir, total=10, already_final=0)
    progress.concurrency = {t.url: t.target for t in targets}  # as Dispatch does at each update
    progress.concurrency_reasons = {t.url: t.why for t in targets}
    progress.update()
    doc = status_payload(run_status(run_dir))["progress"]
    assert doc["concurrency_targets"] == {"http://127.0.0.1:8000": 1024, "http://127.0.0.1:8001": 512}
    assert doc["concurrency_reasons"] == {"http://127.0.0.1:8000": "engine capacity 1024 from /props",
                                          "http://127.0.0.1:8001": "ceiling: latency x2.4 without gain at 1024"}
    write_progress(run_dir, concurrency_targets={"http://127.0.0.1:8000": 24})  # written before reasons existed
    assert status_payload(run_status(run_dir))["progress"]["concurrency_reasons"] == {}


def test_token_counts_out_of_range_in_a_ledger_give_no_inf_or_negative_rate(tmp_path):
    run_dir = tmp_path / "run"
    items = [item(f"i{k}", k + 1, ("user", f"q{k}")) for k in range(3)]
    with Ledger.open(run_dir, settings_hash=SETTINGS) as ledger:
        ledger.ingest(items)
        ledger.claim(3)
        ledger.complete([Completion(i.id, output(i, ["a"]), prompt_tokens=p, completion_tokens=c)
                         for i, (p, c) in zip(items, ((10, 50), (-35_842, 1e308), (10**18, float("inf"))))])
        committed = time.time()
    with Ledger.open_readonly(run_dir) as ledger:
        rate = ledger_rate(ledger, now=committed + 10, window_s=600, started_at=committed - 10)
    assert rate.gen_tokens_per_s == pytest.approx(50 / 20, rel=0.05)
    assert rate.prompt_tokens_per_s == pytest.approx(10 / 20, rel=0.05)
