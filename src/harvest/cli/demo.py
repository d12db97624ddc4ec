"""``harvest demo``: the demo campaign on a tiny local model and vLLM's CPU build."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import click

from harvest.campaign.demo import check_engine_python, ensure_tiny_model, write_demo_job
from harvest.campaign.run import run_campaign
from harvest.cli.live import live_console
from harvest.cli.panel import RunPanel
from harvest.cli.run import print_report, setup_logging, show_preflight
from harvest.config import load_config
from harvest.placement import from_config


@click.command("demo")
@click.option("--engine-python", default=None,
              help="python of the environment holding vLLM's CPU build (default: HARVEST_VLLM_PYTHON, "
                   "else this Python).")
@click.option("--dir", "workdir", default="harvest-demo", show_default=True, type=click.Path(file_okay=False),
              help="folder for the job file, the run and the export.")
@click.option("--port", default=18011, show_default=True, type=click.IntRange(1, 65535),
              help="port of the demo's vLLM server (must be free).")
@click.option("--max-tokens", default=48, show_default=True, type=click.IntRange(min=1),
              help="tokens generated per answer (random weights run every answer to this limit).")
@click.option("--concurrency", default=16, show_default=True, type=click.IntRange(min=1),
              help="requests in flight.")
def demo(engine_python: str | None, workdir: str, port: int, max_tokens: int, concurrency: int) -> None:
    """Build the tiny model if missing, then preflight -> launch -> run -> verified stop -> export."""
    setup_logging()
    python = engine_python or os.environ.get("HARVEST_VLLM_PYTHON") or sys.executable
    check_engine_python(python)
    click.echo(f"[demo] tiny model (built with {python}) ...")
    model = ensure_tiny_model(python)
    click.echo(f"[demo] model: {model}")
    job = write_demo_job(Path(workdir), engine_python=python, model=model, port=port, max_tokens=max_tokens,
                         concurrency=concurrency)
    click.echo(f"[demo] job file: {job}")
    config = load_config(job)
    shown = RunPanel(live_console(), live=False)  # plain lines: a demo's output reads as a log
    report = asyncio.run(run_campaign(config, placement=from_config(config), watch=shown,
                                      on_preflight=show_preflight))
    print_report(report)
    if not report.ok:
        sys.exit(130 if report.outcome == "interrupted" else 1)
    from harvest.campaign.outputs.status import run_status

    status = run_status(report.run_dir)
    counts = ", ".join(f"{k.value} {v}" for k, v in status.counts.items())
    click.echo(f"[demo] status: {counts}")
    from harvest.campaign.outputs.export import export_run

    # Random weights never emit end-of-sequence: the demo keeps truncated answers too.
    exported = export_run(report.run_dir, "specforge", output=Path(workdir) / "export.jsonl",
                          statuses=("done", "truncated"))
    click.echo(f"[demo] exported {exported.written} conversations to {exported.path}")
    if exported.malformed:
        click.echo(f"[demo] {exported.malformed} results did not match the result schema", err=True)
        sys.exit(1)
    from harvest.report import write_report

    click.echo(f"[demo] report: {write_report(report.run_dir)}")
