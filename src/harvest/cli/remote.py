"""The far side of ``harvest gpus|preflight|serve|stop|ps`` when the config names ``[host]`` / ``[[hosts]]``.

Each function calls the far harvest's JSON command through :class:`harvest.placement.ssh.remote.FarHost` (bounded,
one error line on failure, see the CLI group) and renders what came back with the same renderers
as a local run. ``-`` as a CONFIG argument reads the configuration (JSON or TOML) from stdin: that
is how the near side hands ``[server]`` to the far one. Nothing here signals a process.
"""

from __future__ import annotations

import functools
import json
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError
from rich.table import Table
from rich.text import Text

from harvest.cli.render import make_console, rule_line
from harvest.config import HarvestConfig, HostConfig, load_config, parse_config
from harvest.errors import ConfigError, RemoteError
from harvest.placement.ssh.remote import SCHEMAS, FarHost


def load_config_arg(path: Path | str) -> HarvestConfig:
    """``load_config``, or with ``-`` the configuration from stdin (a JSON object, else TOML)."""
    if str(path) != "-":
        return load_config(path)
    text = sys.stdin.read()
    try:
        data = json.loads(text) if text.lstrip().startswith("{") else _toml(text)
    except ValueError as exc:
        raise ConfigError("<stdin>", [("<stdin>", f"not a JSON or TOML configuration: {exc}")]) from None
    if not isinstance(data, dict):
        raise ConfigError("<stdin>", [("<stdin>", "the configuration is not a table")])
    return parse_config(data, source="<stdin>", base=Path.cwd())


def _toml(text: str) -> dict[str, Any]:
    try:
        import tomllib
    except ImportError:  # pragma: no cover - Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib.loads(text)


def hosts_of(config_path: Path | None, flags: HostConfig | None = None) -> list[HostConfig]:
    """The host of ``--host`` flags, else the ``[host]`` / ``[[hosts]]`` of a config file (empty:
    this machine). Both at once is a usage error."""
    if flags is not None:
        if config_path is not None:
            raise ConfigError("--host", [("--host", "give --host (and its flags) or --config, not both")])
        return [flags]
    return [] if config_path is None else load_config(config_path).far_hosts()


def host_from_flags(ssh: str | None, port: int | None, identity_file: str | None, exec_prefix: str | None,
                    ssh_options: tuple[str, ...], far_harvest: str | None) -> HostConfig | None:
    """A ``[host]`` table from command-line flags (None when no flag names a host)."""
    if ssh is None and exec_prefix is None:
        given = [flag for flag, v in (("--port", port), ("--identity-file", identity_file),
                                      ("--ssh-option", ssh_options or None), ("--far-harvest", far_harvest))
                 if v is not None]
        if given:
            raise ConfigError("--host", [(given[0], "needs --host USER@NAME (or --exec-prefix)")])
        return None
    table: dict[str, Any] = {"ssh": ssh, "exec_prefix": shlex.split(exec_prefix or ""),
                             "ssh_options": list(ssh_options)}
    if ssh is None and (port is not None or identity_file is not None or ssh_options):
        raise ConfigError("--host", [("--exec-prefix", "--port, --identity-file and --ssh-option need --host")])
    for key, value in (("port", port), ("identity_file", identity_file), ("harvest", far_harvest)):
        if value is not None:
            table[key] = value
    try:
        return HostConfig.model_validate(table)
    except ValidationError as exc:
        flag = {"ssh": "--host", "harvest": "--far-harvest", "ssh_options": "--ssh-option"}
        raise ConfigError("--host", [(flag.get(str(e["loc"][0]), "--" + str(e["loc"][0]).replace("_", "-")),
                                      e["msg"]) for e in exc.errors()]) from None


def host_options(func: Any) -> Any:
    """``--host USER@NAME`` [``--port``, ``--identity-file``, ``--ssh-option``, ``--exec-prefix``,
    ``--far-harvest``]: the command acts on that host; the function gets ``far_host`` (a HostConfig
    or None)."""

    @functools.wraps(func)
    def wrapper(*args: Any, ssh_host: str | None, ssh_port: int | None, identity_file: str | None,
                exec_prefix: str | None, ssh_options: tuple[str, ...], far_harvest: str | None,
                **kwargs: Any) -> Any:
        try:
            far = host_from_flags(ssh_host, ssh_port, identity_file, exec_prefix, ssh_options, far_harvest)
        except ConfigError as exc:  # a flag's problem: one line naming the flag
            click.echo("error: " + "; ".join(f"{where}: {why}" for where, why in exc.problems), err=True)
            sys.exit(2)
        if far is not None and kwargs.get("config_path") is not None:
            click.echo("error: --host: give --host (and its flags) or --config, not both", err=True)
            sys.exit(2)
        return func(*args, far_host=far, **kwargs)

    options = [
        click.option("--host", "ssh_host", default=None, metavar="USER@NAME",
                     help="act on this host over SSH (instead of --config)"),
        click.option("--port", "ssh_port", type=click.IntRange(1, 65535), default=None,
                     help="with --host: its SSH port (default 22)"),
        click.option("--identity-file", default=None, metavar="KEY", help="with --host: the SSH key"),
        click.option("--ssh-option", "ssh_options", multiple=True, metavar="KEY=VALUE",
                     help="with --host: an `ssh -o` option (repeatable)"),
        click.option("--exec-prefix", default=None, metavar='"ARGV"',
                     help='argv run before every far command, e.g. "pct exec 101 --" (a container)'),
        click.option("--far-harvest", default=None, metavar="PATH",
                     help="the harvest executable on the far side (default: harvest)"),
    ]
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


def _each(hosts: list[HostConfig], work: Any) -> list[Any]:
    """``work(FarHost)`` for every host at once; the first RemoteError (in host order) is raised."""
    with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        futures = [pool.submit(work, FarHost(h)) for h in hosts]
    out = []
    for f in futures:
        out.append(f.result())
    return out


# -- gpus -------------------------------------------------------------------------------------------


def remote_gpus(hosts: list[HostConfig], as_json: bool) -> None:
    docs = _each(hosts, lambda h: (h.label, h.call("gpus", ["gpus", "--json"], schema=SCHEMAS["gpus"])))
    if as_json:
        click.echo(json.dumps({"schema": "harvest.gpus-hosts/1",
                               "hosts": [{"host": label, "gpus": doc} for label, doc in docs]}, indent=2))
        return
    console = make_console()
    table = gpus_by_table(docs, column="host", title="GPUs by host")
    console.print(table)
    for label, doc in docs:
        h = doc["host"]
        console.print(Text(f"{label}: host RAM {h['ram_available_mib']} MiB available of {h['ram_total_mib']} MiB; "
                           f"swap {h['swap_used_mib']} MiB used of {h['swap_total_mib']} MiB"))


def gpus_by_table(docs: list[tuple[str, dict[str, Any] | None]], *, column: str, title: str,
                  missing: dict[str, str] | None = None) -> Table:
    """One table of ``harvest gpus --json`` documents, a first column naming where each came from
    (a host, a Ray node); ``missing`` maps a label without a document to why."""
    table = Table(title=title, title_justify="left")
    for col, justify in ((column, "left"), ("GPU", "right"), ("name", "left"), ("used / total MiB", "right"),
                         ("free MiB", "right"), ("util", "right"), ("processes", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for label, doc in docs:
        if doc is None:
            table.add_row(Text(label), "-", Text(f"no answer: {(missing or {}).get(label, '?')}"), "", "", "", "")
            continue
        if not doc.get("gpus"):
            why = doc.get("error") or doc.get("unavailable_reason") or f"none found ({doc.get('source')})"
            table.add_row(Text(label), "-", Text(f"no GPUs: {why}"), "", "", "", "")
        for g in doc.get("gpus") or []:
            procs = "\n".join(f"pid {p['pid']} {p.get('name') or '?'} {p.get('used_mib')} MiB"
                              for p in g["processes"]) or "-"
            util = f"{g['utilization_pct']}%" if g.get("utilization_pct") is not None else "n/a"
            table.add_row(Text(label), str(g["index"]), Text(g["name"]), f"{g['used_mib']} / {g['total_mib']}",
                          str(g["free_mib"]), util, Text(procs))
    return table


# -- preflight --------------------------------------------------------------------------------------


def remote_preflight(cfg: HarvestConfig, as_json: bool) -> int:
    from harvest.placement.ssh.servers import far_preflight

    server = cfg.require_server()
    reports = _each(cfg.far_hosts(), lambda h: (h.label, far_preflight(h, server, cfg.preflight)))
    if as_json:
        from harvest.cli.render import preflight_payload

        click.echo(json.dumps({"schema": "harvest.preflight-hosts/1", "hosts": [
            {"host": label, **preflight_payload(rep, config=cfg.source, engine=server.engine)}
            for label, rep in reports]}, indent=2))
    else:
        console = make_console()
        for label, rep in reports:
            console.print(f"preflight of {cfg.source} on {label}: {server.engine} port {server.port}", markup=False)
            for r in rep.results:
                console.print(rule_line(r))
            console.print(f"{'PASS' if rep.passed else 'FAIL'} on {label}", markup=False)
    return 0 if all(rep.passed for _, rep in reports) else 1


# -- serve / stop / ps ------------------------------------------------------------------------------


def remote_serve(cfg: HarvestConfig, run_dir: Path | None, detach: bool, force: bool) -> None:
    """Launch on the far host(s); attached: wait for Ctrl-C, then the far verified stop."""
    import signal
    import threading

    from harvest.placement.ssh.servers import RemoteServer
    from harvest.cli.serve import print_stop_report
    from harvest.errors import LaunchError, PreflightFailed
    from harvest.server.state import state_dir

    server_cfg = cfg.require_server()
    hosts = cfg.far_hosts()
    if len(hosts) != 1:
        raise ConfigError(cfg.source, [(f"{cfg.source} [[hosts]]", "harvest serve launches on one host; "
                                        "use [host] (harvest run drives [[hosts]])")])
    err = make_console(stderr=True)
    import os
    import time

    stamp = time.strftime("%Y%m%d-%H%M%S")
    near = run_dir if run_dir is not None else \
        state_dir() / "remote" / f"{stamp}-{server_cfg.engine}-{server_cfg.port}-{os.getpid()}"
    server = RemoteServer(hosts[0], server_cfg, run_dir=near, preflight=cfg.preflight, force=force)
    err.print(f"launching {server_cfg.engine} on {server.label} (near record {near})", markup=False)
    try:
        server.launch()
    except PreflightFailed as exc:
        err.print(f"refused to launch on {server.label}: preflight failed (use --force to launch anyway)",
                  markup=False)
        for r in exc.results:
            if not getattr(r, "passed", True):
                err.print(rule_line(r))  # type: ignore[arg-type]
        sys.exit(1)
    except LaunchError as exc:
        err.print(f"launch failed: {exc}", markup=False)
        sys.exit(1)
    assert server.record is not None
    click.echo(f"ready: {server.url} (far {server.record['far_url']}, far run dir {server.record['far_run_dir']}) "
               f"on {server.label}; near record {near}")
    if detach:
        server.detach()
        click.echo(f"detached; stop it with: harvest stop {near}")
        return
    stop_requested = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop_requested.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop_requested.wait(1.0):
            if server.returncode() is not None or (server.tunnel is not None and server.tunnel.error is not None):
                err.print(f"the far server or its tunnel is gone ({server.tunnel.error if server.tunnel else ''}); "
                          "stopping", markup=False)
                break
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    report = server.shutdown()
    if report is not None:
        print_stop_report(report)
    sys.exit(0 if report is not None and report.clean else 1)


def remote_stop_by_record(record: dict[str, Any], deadline: float | None, as_json: bool) -> None:
    from harvest.placement.ssh.servers import remote_stop
    from harvest.cli.serve import STOP_SCHEMA, print_stop_report

    report = remote_stop(record, deadline=deadline)
    if as_json:
        click.echo(json.dumps({"schema": STOP_SCHEMA, **report.to_dict()}, indent=2))
    else:
        print_stop_report(report)
    sys.exit(0 if report.clean else 1)


def remote_stop_run(hosts: list[HostConfig], far_run_dir: str | None, deadline: float | None,
                    as_json: bool) -> None:
    """``harvest stop --config F [FAR_RUN_DIR]``: the far stop on the one host of F."""
    if len(hosts) != 1:
        raise ConfigError("--config", [("--config", "stop acts on one host: name a config with one [host]")])
    h = FarHost(hosts[0])
    args = ["stop", "--json"] + ([far_run_dir] if far_run_dir else [])
    if deadline is not None:
        args += ["--deadline", f"{deadline:g}"]
    doc = h.call("stop", args, ok_codes=(0, 1), schema=SCHEMAS["stop"], extra_s=deadline or 60.0)
    from harvest.placement.far_records import stop_report_from_dict

    remote_stop_by_record_doc(stop_report_from_dict(doc, host=h.label), as_json)


def remote_stop_by_record_doc(report: Any, as_json: bool) -> None:
    from harvest.cli.serve import STOP_SCHEMA, print_stop_report

    if as_json:
        click.echo(json.dumps({"schema": STOP_SCHEMA, **report.to_dict()}, indent=2))
    else:
        print_stop_report(report)
    sys.exit(0 if report.clean else 1)


def remote_ps(hosts: list[HostConfig], show_all: bool, as_json: bool) -> None:
    args = ["ps", "--json"] + (["--all"] if show_all else [])
    docs = _each(hosts, lambda h: (h.label, h.call("ps", args, schema=SCHEMAS["ps"])))
    rows = [{"host": label, **s} for label, doc in docs for s in doc["servers"]]
    if as_json:
        click.echo(json.dumps({"schema": "harvest.ps-hosts/1", "servers": rows}, indent=2))
        return
    console = make_console()
    if not rows:
        console.print("no server harvest started is running on " + ", ".join(label for label, _ in docs), markup=False)
        return
    console.print(f"{'HOST':<22} {'ENGINE':<10} {'PID':>7} {'PORT':>5}  {'RECORDED':<9} {'ALIVE':<7} "
                  f"{'LISTENING':<9} RUN DIR (far)", markup=False)
    for r in rows:
        alive = f"{r['measured']['alive']}/{r['recorded']['processes']}"
        console.print(f"{r['host']:<22} {r['engine']:<10} {r['pid']:>7} {r['port']:>5}  {r['recorded']['status']:<9} "
                      f"{alive:<7} {'yes' if r['measured']['port_listening'] else 'no':<9} {r['run_dir']}",
                      markup=False)


__all__ = ["RemoteError", "gpus_by_table", "host_from_flags", "host_options", "hosts_of", "load_config_arg",
           "remote_gpus", "remote_preflight", "remote_ps", "remote_serve", "remote_stop_by_record", "remote_stop_run"]
