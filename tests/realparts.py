"""Real parts a test needs (root, sshd, Chromium, tmux, namespaces, a tmpfs, Ray...): one gate for all.

``require(part, reason)`` returns when the part is here. When it is not:
- in CI (``CI`` set to true/1/yes; ``.ci/run`` sets it) the test FAILS, naming the part: a real-part
  test may not quietly vanish from a green run;
- elsewhere (a developer's machine) the test skips with the part and the reason.
Either way the message starts with ``real part missing: <part>``, and the terminal summary
(tests/conftest.py) lists every part that did not run and how many tests it took with it.

``@pytest.mark.realpart(part, reason)`` does the same for a test or a module, before any of its
fixtures is set up (tests/conftest.py).

``HARVEST_TEST_HIDE=chromium,sshd`` makes the named parts count as missing (to prove the gate in
CI without uninstalling anything; tests/test_realparts.py uses it).

The NVIDIA GPU is not gated here: CI has none, so the ``gpu`` marker's skip stays a skip (with its
reason) everywhere. Every other skip of the suite goes through this gate; tests/test_realparts.py
reads the tree so that a new one outside it fails.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

#: The words every gated skip or failure starts with; the summary finds them by it.
PREFIX = "real part missing:"
PATTERN = re.compile(re.escape(PREFIX) + r" (\S+) \((.*?)\) -- ")
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
SSHD = "/usr/sbin/sshd"
#: The far harvest of the host tests: the console script of the venv running the tests.
FAR_HARVEST = str(Path(sys.executable).with_name("harvest"))


def chromium_path() -> str | None:
    """Debian's chromium (or ``HARVEST_CHROMIUM``), None when there is none."""
    env = os.environ.get("HARVEST_CHROMIUM")
    if env:
        return env
    for c in CHROMIUM_CANDIDATES:
        if os.access(c, os.X_OK):
            return c
    return shutil.which("chromium")


def _commands(*names: str, package: str) -> Callable[[], str | None]:
    def check() -> str | None:
        gone = [n for n in names if shutil.which(n) is None and not os.access(f"/usr/sbin/{n}", os.X_OK)]
        if not gone:
            return None
        return f"{', '.join(gone)} not on PATH (Debian package {package}; scripts/install-system)"
    return check


def _module(name: str, extra: str) -> Callable[[], str | None]:
    def check() -> str | None:
        return None if importlib.util.find_spec(name) else f"Python module {name} not installed ({extra})"
    return check


def _root() -> str | None:
    return None if os.geteuid() == 0 else f"runs as uid {os.geteuid()}, not root (CI runs as root)"


def _sshd() -> str | None:
    if os.access(SSHD, os.X_OK):
        return None
    return f"{SSHD} not installed (Debian openssh-server; scripts/install-system)"


def _chromium() -> str | None:
    return None if chromium_path() else "no chromium binary (Debian chromium; scripts/install-system)"


def _second_user() -> str | None:
    """Acting as another local user (``nobody``/``nogroup`` through setpriv) needs root, setpriv and
    that user and group."""
    if os.geteuid() != 0:
        return f"runs as uid {os.geteuid()}, not root: setpriv cannot switch users"
    if shutil.which("setpriv") is None:
        return "setpriv not on PATH (Debian package util-linux; scripts/install-system)"
    import grp
    import pwd

    try:
        pwd.getpwnam("nobody")
        grp.getgrnam("nogroup")
    except KeyError:
        return "no user nobody / group nogroup on this machine"
    return None


def _readable(path: str, what: str) -> Callable[[], str | None]:
    def check() -> str | None:
        return None if os.access(path, os.R_OK) else f"{path} not readable ({what})"
    return check


def _far_harvest() -> str | None:
    return None if os.path.exists(FAR_HARVEST) else f"{FAR_HARVEST} missing (make install)"


#: part -> check (None when present, else why not). A part not listed here is checked by the caller.
CHECKS: dict[str, Callable[[], str | None]] = {
    "root": _root,
    "sshd": _sshd,
    "ssh": _commands("ssh", "ssh-keygen", package="openssh-client"),
    "chromium": _chromium,
    "tmux": _commands("tmux", package="tmux"),
    "unshare": _commands("unshare", "nsenter", package="util-linux"),
    "mount": _commands("mount", "umount", package="mount"),
    "far-harvest": _far_harvest,
    "second-user": _second_user,
    "proc-locks": _readable("/proc/locks", "Linux shows file locks there"),
    # "tmpfs" and "cgroup-freezer" (a cgroup v1 freezer hierarchy): probed by the fixture that mounts
    # them, which passes what it found as ``absent=``.

    "ray": _module("ray", "the test extra: pip install -e '.[test]'"),
    "pyarrow": _module("pyarrow", "the test extra: pip install -e '.[test]'"),
    "uvloop": _module("uvloop", "the test extra: pip install -e '.[test]'"),
}


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def hidden() -> set[str]:
    return {p.strip() for p in os.environ.get("HARVEST_TEST_HIDE", "").split(",") if p.strip()}


def missing(part: str) -> str | None:
    """Why ``part`` is not here, or None when it is (or has no check: the caller probes it)."""
    if part in hidden():
        return "hidden by HARVEST_TEST_HIDE"
    check = CHECKS.get(part)
    return check() if check is not None else None


def require(part: str, reason: str, *, absent: str | None = None) -> None:
    """Go on only if ``part`` is here; ``absent``: the caller's own finding that it is not (e.g. a
    mount that was refused). Fails in CI, skips elsewhere; usable at module level too."""
    why = missing(part) or absent
    if why is None:
        return
    message = f"{PREFIX} {part} ({why}) -- {reason}"
    if in_ci():
        pytest.fail(message + " [CI=true: a real-part test may not skip]", pytrace=False)
    pytest.skip(message, allow_module_level=True)


def parts_in(text: str) -> list[tuple[str, str]]:
    """(part, why) of every gate message in a text."""
    return [(m.group(1), m.group(2)) for m in PATTERN.finditer(text)]


def gate_of(report: object) -> tuple[str, str] | None:
    """(part, why) when a test report's outcome IS the gate (its skip or failure message starts with
    the gate's words), else None: a test that merely prints such a message is not counted."""
    longrepr = getattr(report, "longrepr", None)
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, line, "Skipped: ...")
        text = str(longrepr[2]).removeprefix("Skipped: ")
    else:
        text = str(longrepr or "").strip()
    match = PATTERN.match(text)
    return (match.group(1), match.group(2)) if match else None


__all__ = ["PREFIX", "chromium_path", "gate_of", "hidden", "in_ci", "missing", "parts_in", "require"]
