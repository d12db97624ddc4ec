"""A first attempt that produced nothing does not claim its run folder: after a wrong model name
(or a server that was down) the fixed job runs in the same folder, says so, and generates only its
own items; a folder that holds results stays another job's, as before. Against bench/sim_engine.py
on loopback, through the Python API (the command's own campaign), and on real ledgers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import harvest
from harvest.errors import LedgerError
from harvest.ledger import Ledger, Status, hash_settings
from tests import harvest_process
from tests.engines import free_port, sim_engine


def rows(path: Path, prefix: str, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"{prefix}{i}", "prompt": f"say {i}"}) + "\n" for i in range(n)))
    return path


def test_a_folder_whose_attempt_produced_nothing_takes_the_fixed_job(tmp_path):
    first, second = rows(tmp_path / "a.jsonl", "a", 4), rows(tmp_path / "b.jsonl", "b", 6)
    out = tmp_path / "run"
    with sim_engine() as url:
        job = {"engine": "openai", "base_url": url + "/v1", "out": out, "max_tokens": 4}
        with pytest.raises(harvest.ConfigError, match="'wrong' is not served"):
            harvest.run(**job, model="wrong", data=first)
        assert harvest.status(out).counts[Status.PENDING] == 4  # the attempt left its items pending
        fixed = harvest.run(**job, model="sim-model", data=second)
        assert fixed.ok and fixed.outcome == "finished", fixed.report
        said = fixed.report.resumed
        assert said.startswith(f"{out} held no results (an earlier attempt left 4 pending): it takes this job's "
                               "settings"), said
        assert '[server] model: "wrong" -> "sim-model"' in said and "[data] path: " in said, said
        # only this job's items: none of the earlier dataset's
        st = harvest.status(out)
        assert st.totals.ok and st.totals.unique == 6 and st.settled == 6, st.counts
        exported = harvest.export(out, "sharegpt", statuses=("done", "truncated"), output=tmp_path / "x.jsonl")
        ids = sorted(json.loads(line)["id"] for line in (tmp_path / "x.jsonl").read_text().splitlines())
        assert exported.written == 6 and ids == [f"b{i}" for i in range(6)], ids
        # A folder with results is another job's, as before.
        with pytest.raises(LedgerError, match=r"belongs to another job .*\[sampling\] max_tokens: 4 -> 5"):
            harvest.run(**{**job, "max_tokens": 5}, model="sim-model", data=second)


def test_a_folder_left_by_an_endpoint_that_was_down_takes_the_fixed_job(tmp_path):
    data, out = rows(tmp_path / "a.jsonl", "a", 4), tmp_path / "run"
    job = {"out": out, "data": data, "engine": "openai", "max_tokens": 4}
    down = harvest.run(**job, base_url=f"http://127.0.0.1:{free_port()}/v1", model="tiny",
                       settings={"client.start_deadline": 1})  # nothing listens there
    assert down.outcome == "server_down" and down.counts[Status.PENDING] == 4, down.counts
    with sim_engine() as url:  # the server started, the model named as it serves it
        fixed = harvest.run(**job, base_url=url + "/v1", model="sim-model")
    assert fixed.ok and fixed.outcome == "finished", fixed.report
    said = fixed.report.resumed
    assert said.startswith(f"{out} held no results (an earlier attempt left 4 pending): it takes this job's "
                           "settings") and '[server] model: "tiny" -> "sim-model"' in said, said
    assert harvest.status(out).settled == 4


def test_the_take_over_is_decided_under_the_lock_from_what_the_ledger_holds(tmp_path):
    run = tmp_path / "run"
    with Ledger.open(run, settings_hash=hash_settings({"a": 1})) as led:
        led.ingest(iter([]))  # an empty ingest: no items yet
    # nothing held: replaced, the new ledger under the new hash
    with Ledger.open(run, settings_hash=hash_settings({"a": 2}), other_job="refused", samples=2) as led:
        assert led.created and led.replaced is not None and not any(led.replaced.values()) and led.meta()["settings_hash"] == hash_settings({"a": 2})
    # a failed item is the engine's verdict on it: a result, so the folder is refused
    with Ledger.open(run, settings_hash=hash_settings({"a": 2}), samples=2) as led:
        led.conn.execute("INSERT INTO items(id, sample, status) VALUES ('x', 0, 'failed')")
        led.conn.execute("INSERT INTO items(id, sample, status) VALUES ('y', 0, 'pending')")
    with pytest.raises(LedgerError, match="^refused$"):
        Ledger.open(run, settings_hash=hash_settings({"a": 3}), other_job="refused", samples=2)
    with Ledger.open(run, settings_hash=hash_settings({"a": 2}), samples=2) as led:  # still there, untouched
        assert led.counts()[Status.FAILED] == 1 and not led.created
        led.conn.execute("UPDATE items SET status = 'pending' WHERE id = 'x'")
    with Ledger.open(run, settings_hash=hash_settings({"a": 3}), other_job="refused") as led:
        assert led.replaced is not None and {k: n for k, n in led.replaced.items() if n} == {"pending": 2}
        assert sum(led.counts().values()) == 0 and led.samples == 1


def test_a_model_file_that_is_not_there_is_refused_before_any_launch(tmp_path):
    # Before, llama-server was started on it, failed, and was stopped: now the launch's preflight
    # names the path and its fix, and nothing is spawned (the "engine" here would be a Python
    # that exits at once, were it ever started).
    import subprocess
    import sys

    rows(tmp_path / "p.jsonl", "p", 3)
    (tmp_path / "job.toml").write_text(
        f'[server]\nengine = "llamacpp"\nmodel = "models/tiny.gguf"\ncommand = ["{sys.executable}"]\nport = 9\n'
        '[data]\npath = "p.jsonl"\n[output]\ndir = "run"\n[preflight]\nmin_disk_free_gib = 0\n')
    out = harvest_process.run([sys.executable, "-m", "harvest", "run", "job.toml", "--no-live"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                              env={**__import__("os").environ, "HARVEST_STATE_DIR": str(tmp_path / "state")})
    said = out.stdout + out.stderr
    assert out.returncode == 1, said
    assert (f"FAIL  paths          [server] model {tmp_path / 'models' / 'tiny.gguf'} does not exist: [server] "
            "model names the GGUF file llama-server loads (-m)") in said, said
    assert "refused to launch: preflight failed" in said and not (tmp_path / "run" / "server" / "launch.json").exists()
