"""What a run folder holds, said to a person (campaign/run/folder.py), on real ledgers: a folder of
another job names each setting that differs and the other dataset; the same dataset moved is the
same job; the resume line; the skipped share."""

from __future__ import annotations

from harvest.campaign.run.folder import failed_problem, other_job, resume_line, settings_diff, skipped_problem
from harvest.ledger import Ledger, Status, Totals, hash_settings

SETTINGS = {"model": "m", "engine": "openai", "sampling": {"max_tokens": 256, "temperature": 0.0},
            "history": "regenerated", "truncated": ["keep", None], "system_prompt": None}


def folder(tmp_path, settings=SETTINGS, path="/data/a.jsonl", fingerprint="f1"):
    run = tmp_path / "run"
    with Ledger.open(run, settings_hash=hash_settings(settings),
                     meta={"output_settings": settings, "job": {"data": {"path": path}}, "job_file": "a.toml"}) as led:
        led.set_meta("dataset_fingerprint", fingerprint)
    return run


def test_another_job_names_each_setting_and_the_other_dataset(tmp_path):
    run = folder(tmp_path)
    now = {**SETTINGS, "sampling": {"max_tokens": 64, "temperature": 0.0}, "history": "original"}
    why = other_job(run, now, "/data/b.jsonl", "f2")
    assert why is not None and why.startswith(f"{run} belongs to another job (made by a.toml); this job differs in ")
    assert "[sampling] max_tokens: 256 -> 64" in why and '[run] history: "regenerated" -> "original"' in why
    assert "[data] path: /data/a.jsonl -> /data/b.jsonl" in why and "--allow-mixed" in why
    assert other_job(run, SETTINGS, "/data/a.jsonl", "f1") is None  # the same job
    assert other_job(run, SETTINGS, "/moved/a.jsonl", "f1") is None  # the same file, moved
    assert other_job(tmp_path / "none", SETTINGS, "/data/a.jsonl", "f1") is None  # no ledger: a new run
    assert settings_diff({"model": "a"}, {"model": "b", "dtype": "bf16"}) == [
        '[server] dtype: (unset) -> "bf16"', '[server] model: "a" -> "b"']


def test_resume_line_and_skipped_share():
    counts = {s: 0 for s in Status}
    counts.update({Status.DONE: 470, Status.PENDING: 1500, Status.RUNNING: 30, Status.FAILED: 3})
    line = resume_line(counts, 30, {"rows": 2003, "complete": True}, False)
    assert line.startswith("resuming: 470 done, 1,530 pending (3 failed); 30 left running")
    assert line.endswith("; generating the 1,530 pending")
    done = {s: 0 for s in Status} | {Status.DONE: 4, Status.SKIPPED: 6}
    totals = Totals(input_rows=10, unique=10, duplicates=0, counts=done, results=4, ingest_complete=True)
    assert skipped_problem(totals, 0.5) == ("6 of 10 input rows were skipped (60%, more than [data] "
                                            "max_skipped_share 50%)")
    assert skipped_problem(totals, 0.6) is None
    every = {s: 0 for s in Status} | {Status.SKIPPED: 10}
    assert skipped_problem(Totals(10, 10, 0, every, 0, True), 1.0) == \
        "every input row (10) was skipped: nothing was generated"
    # No row at all (an empty file: most likely the wrong one) fails the run, naming the file; not
    # while the ingest is still reading.
    nothing = {s: 0 for s in Status}
    assert skipped_problem(Totals(0, 0, 0, nothing, 0, True), 0.5, "data/empty.jsonl") == \
        "the dataset (data/empty.jsonl) has no rows: nothing was generated"
    assert skipped_problem(Totals(0, 0, 0, nothing, 0, False), 0.5, "data/empty.jsonl") is None


def test_more_failed_items_than_the_share_fail_the_run():
    counts = {s: 0 for s in Status} | {Status.DONE: 4, Status.FAILED: 6}
    totals = Totals(input_rows=10, unique=10, duplicates=0, counts=counts, results=4, ingest_complete=True)
    assert failed_problem(totals, 0.5) == "6 of 10 items failed (60%, more than [run] max_failed_share 50%)"
    assert failed_problem(totals, 0.6) is None
    assert failed_problem(Totals(10, 10, 0, {s: 0 for s in Status} | {Status.DONE: 10}, 10, True), 0.0) is None
