"""docs/remote.md's "A remote box" and "A container on a remote box" sections run as written against the
test's sshd: their TOML files are written as given, with only the lines that name the box adapted
(host and port, key, known-hosts file, where the far harvest is) and, for the container, `pct`
replaced by a stand-in that enters the test's namespace container (`pct exec 101 --` -> `nsenter`);
then every `harvest` command of their shell blocks is run and must succeed."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from tests import harvest_process
from tests.hosts.conftest import FAR_ENV, FAR_HARVEST
from tests.hosts.test_container import container  # noqa: F401 - fixture

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "remote.md"

PCT = """#!/bin/sh
# Stand-in for Proxmox's `pct exec ID -- CMD...`: enters the test's namespace container instead.
[ "$1" = exec ] && [ "$2" = 101 ] && [ "$3" = -- ] || { echo "pct stand-in: unexpected $*" >&2; exit 2; }
shift 3
echo "$*" >> {log}
exec nsenter -t {init} -p -m -- "$@"
"""


def section(title: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(file name, TOML text) of each ```toml block and every `harvest` line of the ```sh blocks."""
    text = GUIDE.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    body = text[start:end]
    tomls = []
    for block in re.findall(r"```toml\n(.*?)```", body, re.S):
        name = block.splitlines()[0].lstrip("# ").strip()
        tomls.append((name, block))
    commands = [ln.split("#")[0].strip() for block in re.findall(r"```sh\n(.*?)```", body, re.S)
                for ln in block.splitlines() if ln.strip().startswith("harvest ")]
    return tomls, commands


def adapt(toml: str, sshd, harvest: str) -> str:
    """Only the lines that name the box change."""
    out = []
    for line in toml.splitlines():
        key = line.split("=")[0].strip()
        if key == "ssh":
            line = 'ssh = "root@127.0.0.1"'
        elif key == "port":
            line = f"port = {sshd.port}"
        elif key == "identity_file":
            line = f'identity_file = "{sshd.key}"'
        elif key == "ssh_options":
            line = f'ssh_options = ["UserKnownHostsFile={sshd.known_hosts}"]'
        elif key == "harvest":
            line = f'harvest = "{harvest}"'
        out.append(line)
    if not any(ln.startswith("port") for ln in out):
        out.insert(out.index("[host]") + 1, f"port = {sshd.port}")
    return "\n".join(out) + "\n"


def run_section(title: str, tmp_path: Path, sshd, harvest: str, replace: dict[str, str] | None = None) -> None:
    tomls, commands = section(title)
    assert tomls and commands, f"docs/remote.md section {title!r} has no TOML or no harvest command"
    for name, text in tomls:
        adapted = adapt(text, sshd, harvest)
        for old, new in (replace or {}).items():
            adapted = adapted.replace(old, new)
        (tmp_path / name).write_text(adapted)
    for command in commands:
        argv = shlex.split(command)
        res = harvest_process.run([FAR_HARVEST, *argv[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, f"{command}\n{res.stdout}\n{res.stderr}"
        assert f"127.0.0.1:{sshd.port}" in res.stdout, (command, res.stdout)


def far_harvest(sshd) -> str:
    """The far harvest as the guide's `harvest = "..."` line names it: this checkout, its own state."""
    return " ".join(["env", f"HARVEST_STATE_DIR={sshd.state_dir}", *FAR_ENV, FAR_HARVEST])


def test_remote_box_section_runs_as_written(tmp_path, sshd):
    run_section("A remote box", tmp_path, sshd, far_harvest(sshd))


def test_container_section_runs_as_written(tmp_path, sshd, container):  # noqa: F811
    init_pid, _ns = container
    pct, entered = tmp_path / "pct", tmp_path / "pct.log"
    pct.write_text(PCT.replace("{init}", str(init_pid)).replace("{log}", str(entered)))
    pct.chmod(0o755)
    run_section("A container on a remote box", tmp_path, sshd,
                far_harvest(sshd), replace={'"pct"': f'"{pct}"'})
    # Every far command went into the container through the guide's exec_prefix: the far harvest's
    # `gpus --json` and `ps --json`, each entered by `pct exec 101 --`.
    calls = entered.read_text().splitlines() if entered.exists() else []
    assert any(" gpus " in f" {c} " and "--json" in c for c in calls), calls
    assert any(" ps " in f" {c} " and "--json" in c for c in calls), calls
    assert all(FAR_HARVEST in c for c in calls), calls
