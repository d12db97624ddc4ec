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

#: A command-line flag whose value is a secret, matched on the flag's name (dashes and underscores
#: alike, any case): a name ending in ``key``, ``token``, ``secret``, ``password``/``passwd`` or
#: ``credential(s)`` (``--api-key``, ``--admin-api-key``, ``--hf-token``, ``--password``,
#: ``--db_secret``), and llama.cpp's short ``-hft``. Names that only contain such a word
#: (``--max-num-batched-tokens``, ``--ssl-keyfile``, ``--api-key-file``) are not secrets.
SECRET_FLAG = re.compile(r"^(--?[\w-]*(key|token|secret|passw(or)?d|credentials?)|-hft)$", re.IGNORECASE)
#: An environment variable whose value is a secret: ``HF_TOKEN``, ``OPENAI_API_KEY``, ``*_SECRET`` ...
SECRET_ENV = re.compile(r"(KEY|TOKEN|SECRET|PASSW(OR)?D|CREDENTIALS?)$", re.IGNORECASE)
#: ``scheme://user:password@host``: the password part.
URL_PASSWORD = re.compile(r"(\w+://[^/\s:@]*:)([^/\s@]+)(@)")


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


def redact_doc(value: Any, secrets: Sequence[str] = ()) -> Any:
    """A JSON-like document fit to record: URL passwords (and known secrets) in every string, keys
    included, become ``***``, and so do the values of secret-named keys (``HF_TOKEN``, ``api_key``;
    ``runtime_env.env_vars`` of a Ray cluster, ``[server.env]``)."""
    if isinstance(value, str):
        return redact_text(value, secrets)
    if isinstance(value, Mapping):
        return {redact_text(str(k), secrets) if isinstance(k, str) else k:
                (REDACTED if isinstance(k, str) and SECRET_ENV.search(k) and isinstance(v, str) and v
                 else redact_doc(v, secrets))
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_doc(v, secrets) for v in value]
    return value


#: C0 controls but tab and newline, DEL, and C1 controls: what a terminal may act on.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROLS_ONE_LINE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def escape_controls(text: str, *, one_line: bool = False) -> str:
    """``text`` safe to print on a terminal: control characters (escape sequences, carriage
    returns, bells ...) shown as ``\\x1b``-style escapes; with ``one_line`` newlines and tabs too."""
    pattern = _CONTROLS_ONE_LINE if one_line else _CONTROLS
    return pattern.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


#: A secret flag and its value inside free text (an engine echoing its argv, as a list or a line):
#: ``--api-key xyz``, ``--hf-token=xyz``, ``'--api-key', 'xyz'``, ``api_key='xyz'`` (the value hidden).
_FLAG_IN_TEXT = re.compile(r"((?<![\w-])-{0,2}[\w-]*(?:key|token|secret|passw(?:or)?d)['\"]?(?:[\s=:,]|, ')+['\"]?)"
                           r"(?!None\b|\*\*\*)([^\s'\",)\]}]+)", re.IGNORECASE)


def safe_line(text: str, secrets: Sequence[str] = ()) -> str:
    """Engine output or a server error fit to echo or record: known secrets, URL passwords and
    the value after a secret flag become ``***``; control characters are escaped."""
    text = _FLAG_IN_TEXT.sub(lambda m: m.group(1) + REDACTED, redact_text(text, secrets))
    return escape_controls(text)


def redact_server_settings(server: Mapping[str, Any], secrets: Sequence[str] = ()) -> dict[str, Any]:
    """A dumped ``[server]`` table with ``extra_args``, ``command`` and ``env`` redacted."""
    out = dict(server)
    for name in ("extra_args", "command"):
        if isinstance(out.get(name), (list, tuple)):
            out[name] = list(redact_argv([str(a) for a in out[name]], secrets))
    if isinstance(out.get("env"), Mapping):
        out["env"] = redact_env(out["env"], secrets)
    return out


__all__ = ["REDACTED", "SECRET_ENV", "SECRET_FLAG", "escape_controls", "redact_argv", "redact_doc", "redact_env",
           "redact_server_settings", "redact_text", "safe_line"]
