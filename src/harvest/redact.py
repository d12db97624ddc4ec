"""Secrets kept out of everything harvest writes: launch records, ledgers, references, logs.

Keys travel the documented way (``api_key_env`` names an environment variable), but users also
paste ``--api-key sk-...`` into ``extra_args`` or an ``HF_TOKEN`` into ``[server.env]``. Whatever
harvest records of a command line or a config passes through here first.

Secrets are found by name and by shape. By name: a secret flag's value, a secret-named variable's
value (``HF_TOKEN``, ``MY_API_KEY=...`` as an argument). By shape, whatever the name: a URL's user
part, with or without a password (``http://TOKEN@host`` and ``http://u:pw@host`` both show as
``http://***@host``: the user part may itself be the token), a query parameter whose name holds
``key``, ``token``, ``secret``, ``auth``, ``password``/``passwd``, ``signature`` or ``credential``
(``?api_key=***``, ``&X-Amz-Signature=***``), and a ``Bearer``/``Basic`` credential (a variable
whose value is the scheme and one token is hidden whole; in text the token after ``Bearer`` or after
``Authorization: Basic``). Only what is shown or recorded is redacted: the request and the process
launch use the values as given.

What harvest shows that it did not write itself (an engine's error, an item id, a path, a URL, a
config value, a note built from them) is shown as it is: control characters escaped
(:func:`escape_controls`); the command line hands it to rich only as text, never as markup
(``harvest.cli.text.as_text``). This module imports nothing of the display.
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
#: ``scheme://userinfo@host``: the user part, with or without a password (a token as the user), up
#: to the last ``@`` before the host (a password with an unencoded ``@`` in it is hidden whole).
URL_USER = re.compile(r"(\w+://)([^/\s?#'\"<>]+)(@)")
#: A query parameter whose name looks like a credential: ``?api_key=``, ``&access_token=``,
#: ``&api_tokens=``, ``&X-Amz-Signature=``, ``;auth=`` (any case, the word anywhere in the name;
#: ``max_tokens`` and the other token counts are counts, not tokens): its value.
QUERY_SECRET = re.compile(r"([?&;](?![^=&#\s?;'\"<>]*(?:max|min|num|n|total|prompt|completion|input|output)[_-]?tokens=)"
                          r"[^=&#\s?;'\"<>]*(?:key|token|secret|auth|passw(?:or)?d|signature|credential)"
                          r"[^=&#\s?;'\"<>]*=)([^&#\s;'\"<>]+)", re.IGNORECASE)
#: A value that is an HTTP credential whatever its name: ``Bearer <token>``, ``Basic <token>``.
AUTH_VALUE = re.compile(r"^\s*(bearer|basic)\s+[\w.~+/=:-]+\s*$", re.IGNORECASE)
#: ``Authorization: Bearer|Basic <token>`` anywhere in text, and ``Bearer <token>`` (the word as
#: a scheme is spelled, a token of 8 or more token characters): the token.
_AUTH_IN_TEXT = re.compile(r"((?i:\bauthorization['\"]?\s*[:=,]\s*['\"]?(?:bearer|basic)\s+)(?!\*\*\*)"
                           r"(?=[^\s'\",)\]}])|\b(?:Bearer|BEARER|bearer(?=\s+\S*\d))\s+(?=[\w.~+/=-]{8}))"
                           r"([^\s'\",)\]}]+)")
#: ``Authorization: <anything>`` and the other headers that carry a credential (``Proxy-Authorization``,
#: ``Cookie``, ``Set-Cookie``, ``X-Api-Key``, ``Api-Key``, ``X-Auth-Token``, any ``X-...-Key``/``-Token``/
#: ``-Secret``) written as a header, a JSON pair or an assignment inside text: the value, up to the end
#: of the line or the closing quote (an auth scheme before it is kept: ``Authorization: Bearer ***``).
_HEADER_IN_TEXT = re.compile(r"((?<![\w-])(?:(?:proxy-)?authorization|(?:set-)?cookie|(?:x-)?api[-_]key|"
                             r"x-[\w-]*(?:key|token|secret))['\"]?\s*[:=]\s*['\"]?(?:(?:bearer|basic|digest|token)\s+)?+)"
                             r"(?!\*\*\*)([^\s'\"][^\r\n'\"]*)", re.IGNORECASE)
#: Header names whose value is a credential, compared with ``-`` and ``_`` alike, any case.
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "api-key",
                            "x-auth-token", "x-access-token"})
#: The words of a document key that make its string value a secret wherever they stand in it
#: (``access_token``, ``X-Auth-Token``, ``client_secret_value``, ``db_password``), and the words
#: after which such a key names something else (``api_key_env`` names a variable, ``token_file`` a path).
_SECRET_WORDS = frozenset({"token", "secret", "password", "passwd", "credential", "credentials", "auth",
                           "authorization", "cookie", "apikey", "bearer"})
_NAMING_WORDS = frozenset({"env", "file", "path", "dir", "type", "mode", "name", "names", "count", "ids", "url"})
#: ``NAME=VALUE`` as one argument (``env MY_API_KEY=...``, ``sh -c 'HF_TOKEN=... srv'``): the name.
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
#: ``NAME=VALUE`` with a secret name inside text (``sh -c 'A=1 MY_API_KEY=... srv'``): the value.
_ASSIGNMENT_IN_TEXT = re.compile(r"((?<![\w.$-])[A-Za-z_]\w*(?:key|token|secret|passw(?:or)?d|credentials?)=)"
                                 r"(?!None\b|\*\*\*)([^\s'\";&|,)]+)", re.IGNORECASE)


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every known secret, every URL user part (password included), every
    credential-named query parameter and every ``Bearer`` token replaced by ``***``."""
    for s in secrets:
        if s:
            text = text.replace(s, REDACTED)
    text = URL_USER.sub(lambda m: m.group(1) + REDACTED + m.group(3), text)
    text = QUERY_SECRET.sub(lambda m: m.group(1) + REDACTED, text)
    text = _ASSIGNMENT_IN_TEXT.sub(lambda m: m.group(1) + REDACTED, text)
    text = _AUTH_IN_TEXT.sub(lambda m: m.group(1) + REDACTED, text)
    return _HEADER_IN_TEXT.sub(lambda m: m.group(1) + REDACTED, text)


def hide_url_path(url: str) -> str:
    """``https://hooks.example.com/***``: a URL with its user part, path, query and fragment hidden,
    for a URL whose path is itself the key (a chat webhook's ``/services/T/B/KEY``)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return REDACTED
    host = re.split(r"[/?#]", rest, maxsplit=1)[0].rpartition("@")[2]
    return f"{scheme}://{host}/{REDACTED}"


def is_secret_key(name: str) -> bool:
    """Whether a document key names a secret (its string value is one): a header that carries a
    credential (:data:`SECRET_HEADERS`: ``authorization``, ``cookie``, ``x-api-key`` ...), a name
    ending in ``key``, ``token``, ``secret``, ``password``/``passwd`` or ``credential(s)``
    (:data:`SECRET_ENV`: ``api_key``, ``HF_TOKEN``), or one holding ``token``, ``secret``,
    ``password``, ``auth``, ``cookie`` ... as a word (``access_token_value``, ``X-Auth-User``) unless
    its last word says it names something else (``api_key_env``, ``token_file``, ``secret_name``).
    Counts are no secrets: ``max_tokens`` ends in ``tokens``, and only string values are redacted."""
    words = [w for w in re.split(r"[^a-z0-9]+", re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()) if w]
    if not words or words[-1] in _NAMING_WORDS:
        return False
    return ("-".join(words) in SECRET_HEADERS or bool(SECRET_ENV.search(name.strip()))
            or any(w in _SECRET_WORDS for w in words))


def is_secret_variable(name: str, value: str) -> bool:
    """Whether the variable ``name=value`` holds a secret: a secret name (:data:`SECRET_ENV`) or a
    value that is an HTTP credential (``Bearer ...``, ``Basic ...``), whatever the name."""
    return bool(SECRET_ENV.search(name) or AUTH_VALUE.match(value))


def secret_assignment(arg: str) -> str | None:
    """The variable name when the argument ``arg`` is ``NAME=VALUE`` holding a secret
    (``MY_API_KEY=...``, ``AUTH=Bearer ...``), else None."""
    m = _ASSIGNMENT.match(arg)
    if m is None or not m.group(2) or not is_secret_variable(m.group(1), m.group(2)):
        return None
    return m.group(1)


def secret_assignment_problem(argv: Sequence[str], field: str) -> str | None:
    """Why ``argv`` may not hold ``NAME=VALUE`` with a secret (``env MY_API_KEY=...``, ``sh -c
    'HF_TOKEN=... srv'``): every user of the machine reads a process's argv in /proc/PID/cmdline,
    the launcher's (``env``, a shell) included. The message names the variable, never the value."""
    for arg in argv:
        for word in [arg, *arg.split()]:
            name = secret_assignment(word.strip("'\""))
            if name is not None:
                return (f"`{field}` sets {name} on the command line: every user of this machine can read a "
                        f"server's command line (/proc/PID/cmdline). Set {name} in [server.env] instead "
                        f"(the engine's environment), or pass an API key with `api_key_env`")
    return None


def secret_env_values(env: Mapping[str, str]) -> list[str]:
    """The values of the variables in ``env`` that hold secrets (see :func:`is_secret_variable`)."""
    return [v for k, v in env.items() if v and is_secret_variable(k, v)]


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
        elif (name := secret_assignment(arg)) is not None:
            out.append(name + "=" + REDACTED)
        else:
            out.append(redact_text(arg, known))
    return tuple(out)


def redact_env(env: Mapping[str, str], secrets: Sequence[str] = ()) -> dict[str, str]:
    """Environment variables fit to record: values of secret-named variables and values that are
    HTTP credentials (``Bearer ...``, ``Basic ...``) become ``***``; the rest lose URL secrets."""
    return {k: REDACTED if is_secret_variable(k, v) else redact_text(v, secrets) for k, v in env.items()}


def redact_doc(value: Any, secrets: Sequence[str] = ()) -> Any:
    """A JSON-like document fit to record or show: URL user parts and query secrets (and known
    secrets) in every string, keys included, become ``***``, and so do the string values of
    secret-named keys (:func:`is_secret_key`: ``HF_TOKEN``, ``api_key``, a header such as
    ``authorization`` or ``x-api-key`` in ``[sampling] extra_body``; ``runtime_env.env_vars`` of a
    Ray cluster, ``[server.env]``), string values that are HTTP credentials (``Bearer ...``),
    ``NAME=VALUE`` strings holding a secret (an argv element) and headers inside text
    (``Authorization: Basic ...``). The one redaction every record, page and console line of harvest
    passes through (with :func:`redact_text` for a single string)."""
    if isinstance(value, str):
        if AUTH_VALUE.match(value):
            return REDACTED
        name = secret_assignment(value)
        return name + "=" + REDACTED if name is not None else redact_text(value, secrets)
    if isinstance(value, Mapping):
        return {redact_text(str(k), secrets) if isinstance(k, str) else k:
                (REDACTED if isinstance(k, str) and isinstance(v, str) and v
                 and (is_secret_variable(k, v) or is_secret_key(k)) else redact_doc(v, secrets))
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_doc(v, secrets) for v in value]
    return value


#: The bidirectional overrides, embeddings and isolates (U+202A-202E, U+2066-2069): text after one
#: is shown reordered ("Trojan Source"), so a line can read other than it is.
_BIDI = "\u202a-\u202e\u2066-\u2069"
#: C0 controls but tab and newline, DEL, C1 controls (what a terminal may act on), and the above.
_CONTROLS = re.compile(f"[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f{_BIDI}]")
_CONTROLS_ONE_LINE = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f{_BIDI}]")


def escape_controls(text: str, *, one_line: bool = False) -> str:
    """``text`` safe to print on a terminal: control characters (escape sequences, carriage
    returns, bells ...) shown as ``\\x1b``-style escapes, and bidirectional overrides as
    ``\\u202e``; with ``one_line`` newlines and tabs too."""
    pattern = _CONTROLS_ONE_LINE if one_line else _CONTROLS
    return pattern.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}",
                       text)


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


__all__ = ["AUTH_VALUE", "QUERY_SECRET", "REDACTED", "SECRET_ENV", "SECRET_FLAG", "SECRET_HEADERS", "URL_PASSWORD",
           "URL_USER", "escape_controls", "hide_url_path", "is_secret_key", "is_secret_variable", "redact_argv", "redact_doc", "redact_env", "redact_server_settings",
           "redact_text", "safe_line", "secret_assignment", "secret_assignment_problem",
           "secret_env_values"]
