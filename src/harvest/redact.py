"""Secrets kept out of everything harvest writes: launch records, ledgers, references, logs.

Keys travel the documented way (``api_key_env`` names an environment variable), but users also
paste ``--api-key sk-...`` into ``extra_args`` or an ``HF_TOKEN`` into ``[server.env]``. Whatever
harvest records of a command line or a config passes through here first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

REDACTED = "***"

#: A command-line flag whose value is a secret: ``--api-key``, ``--hf-token``, ``--admin-api-key``,
#: ``--password``, ``--secret`` ... (matched on the flag's name, dashes and underscores alike).
SECRET_FLAG = re.compile(r"^--?[\w-]*(api[-_]?key|token|secret|passw(or)?d|credentials?)$", re.IGNORECASE)
#: An environment variable whose value is a secret: ``HF_TOKEN``, ``OPENAI_API_KEY``, ``*_SECRET`` ...
SECRET_ENV = re.compile(r"(KEY|TOKEN|SECRET|PASSW(OR)?D|CREDENTIALS?)$", re.IGNORECASE)
#: ``scheme://user:password@host``: the password part.
URL_PASSWORD = re.compile(r"(\w+://[^/\s:@]+:)([^/\s@]+)(@)")


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every known secret and every URL password replaced by ``***``."""
    for s in secrets:
        if s:
            text = text.replace(s, REDACTED)
    return URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + m.group(3), text)


def redact_argv(argv: Sequence[str], secrets: Sequence[str] = ()) -> tuple[str, ...]:
    """A command line fit to record: the value after a secret flag (``--api-key V``,
    ``--api-key=V``, ``--hf-token V`` ...), every known secret and URL passwords become ``***``."""
    known = [s for s in secrets if s]
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag, eq, _ = arg.partition("=")
        if SECRET_FLAG.match(flag):
            if eq:
                out.append(flag + "=" + REDACTED)
            else:
                out.append(arg)
                hide_next = True
        elif arg in known:
            out.append(REDACTED)
        else:
            out.append(redact_text(arg, known))
    return tuple(out)


def redact_env(env: Mapping[str, str], secrets: Sequence[str] = ()) -> dict[str, str]:
    """Environment variables fit to record: values of secret-named variables become ``***``."""
    return {k: REDACTED if SECRET_ENV.search(k) else redact_text(v, secrets) for k, v in env.items()}


def redact_server_settings(server: Mapping[str, Any], secrets: Sequence[str] = ()) -> dict[str, Any]:
    """A dumped ``[server]`` table with ``extra_args``, ``command`` and ``env`` redacted."""
    out = dict(server)
    for name in ("extra_args", "command"):
        if isinstance(out.get(name), (list, tuple)):
            out[name] = list(redact_argv([str(a) for a in out[name]], secrets))
    if isinstance(out.get("env"), Mapping):
        out["env"] = redact_env(out["env"], secrets)
    return out


__all__ = ["REDACTED", "redact_argv", "redact_env", "redact_server_settings", "redact_text"]
