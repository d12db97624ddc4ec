"""Real OpenSSH servers for the host tests: Debian's /usr/sbin/sshd started by the test on a loopback
port, with its own host key and an authorized key made per test; the far harvest is this checkout's
own (the venv running the tests). Everything started here is stopped here, by the pid recorded at
launch (with its create time).

Needs root (sshd's privilege separation, and logging in as the test's user with a key made for it)
and the openssh-server package (installed by scripts/install-system); without them the tests fail in
CI and skip elsewhere, naming what is missing (tests/realparts.py).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests.engines import free_port
from tests.realparts import FAR_HARVEST, SSHD, require

ROOT = Path(__file__).resolve().parents[2]
#: The far harvest (FAR_HARVEST): the console script of the venv running the tests, importing this
#: checkout (FAR_ENV: the far side starts from a clean environment, whatever the venv was installed from).
FAR_ENV = [f"PYTHONPATH={ROOT / 'src'}"]


def require_sshd() -> None:
    """The real parts an sshd test needs (tests/realparts.py: fails in CI, skips elsewhere)."""
    why = "the host tests log in over a real sshd on a loopback port"
    require("sshd", why)
    require("ssh", why)
    require("root", "sshd's privilege separation and a per-test login as this user need root")
    require("far-harvest", "the far side runs this checkout's harvest console script")


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True, timeout=30)
    return path


@dataclass
class Sshd:
    """One sshd the test started; ``host_table`` is the [host] table that reaches it."""

    port: int
    key: Path
    known_hosts: Path
    proc: subprocess.Popen
    create_time: float
    folder: Path
    state_dir: Path
    extra_prefix: list[str] = field(default_factory=list)

    def host_table(self, **over: object) -> dict[str, object]:
        table: dict[str, object] = {
            "ssh": "root@127.0.0.1", "port": self.port, "identity_file": str(self.key),
            "ssh_options": [f"UserKnownHostsFile={self.known_hosts}", "StrictHostKeyChecking=yes"],
            # The far harvest keeps its state apart from this machine's own (one box in real life).
            "exec_prefix": ["env", f"HARVEST_STATE_DIR={self.state_dir}", *FAR_ENV, *self.extra_prefix],
            "harvest": FAR_HARVEST, "connect_timeout": 10, "command_timeout": 60,
        }
        table.update(over)
        return table

    def session_children(self) -> list[psutil.Process]:
        """The per-connection sshd processes under the listener (children of the pid we started)."""
        try:
            return psutil.Process(self.proc.pid).children()
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        p = self.proc
        if p.poll() is None:
            if psutil.Process(p.pid).create_time() == self.create_time:
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)


def start_sshd(folder: Path) -> Sshd:
    folder.mkdir(parents=True, exist_ok=True)
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation folder
    hk, uk = keygen(folder / "host_key"), keygen(folder / "user_key")
    (folder / "authorized_keys").write_text((folder / "user_key.pub").read_text())
    state = folder / "far-state"
    state.mkdir()
    for _ in range(5):
        port = free_port()
        conf = folder / "sshd_config"
        conf.write_text("\n".join([
            f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {hk}",
            f"AuthorizedKeysFile {folder / 'authorized_keys'}", f"PidFile {folder / 'sshd.pid'}",
            "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "UsePAM no", "StrictModes no", "AllowTcpForwarding yes", "MaxStartups 100", "MaxSessions 100",
            "LogLevel VERBOSE", "",
        ]))
        log = open(folder / f"sshd-{port}.log", "wb")
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(conf)], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        ct = psutil.Process(proc.pid).create_time()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                time.sleep(0.05)
        if proc.poll() is None:
            pub = (folder / "host_key.pub").read_text().split()
            known = folder / "known_hosts"
            known.write_text(f"[127.0.0.1]:{port} {pub[0]} {pub[1]}\n")
            return Sshd(port, uk, known, proc, ct, folder, state)
        text = (folder / f"sshd-{port}.log").read_text(errors="replace")
        if "address already in use" not in text.lower():
            raise RuntimeError(f"sshd did not start:\n{text[-3000:]}")
    raise RuntimeError("sshd: no free port after 5 tries")


@pytest.fixture
def sshd(tmp_path: Path):
    require_sshd()
    server = start_sshd(tmp_path / "sshd")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def sshd2(tmp_path: Path):
    require_sshd()
    server = start_sshd(tmp_path / "sshd2")
    try:
        yield server
    finally:
        server.stop()


def _toml_value(v: object) -> str:
    import json

    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):  # an inline table
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"no TOML for {v!r}")


def write_toml(path: Path, tables: dict[str, object]) -> Path:
    """A job file from {table: {key: value}}; a nested dict is a sub-table, a list of dicts [[array]]."""
    lines: list[str] = []

    def table(name: str, body: dict) -> None:
        lines.append(f"[{name}]")
        subs = []
        for k, v in body.items():
            if isinstance(v, dict):
                subs.append((f"{name}.{k}", v))
            else:
                lines.append(f"{k} = {_toml_value(v)}")
        for sub_name, sub in subs:
            table(sub_name, sub)

    for name, body in tables.items():
        if isinstance(body, list):
            for entry in body:
                lines.append(f"[[{name}]]")
                lines.extend(f"{k} = {_toml_value(v)}" for k, v in entry.items())
        else:
            table(name, body)  # type: ignore[arg-type]
    path.write_text("\n".join(lines) + "\n")
    return path
