"""What every table of the configuration shares: the strict base model, the limits of a value, the
engine names, and the checks more than one table makes (a path's length, a secret flag in an argv,
a public address without an API key).

Pure functions and one base class: nothing here reads a file or touches the machine.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

EngineKind = Literal["sglang", "vllm", "transformers", "llamacpp", "openai", "command"]

#: Engines harvest starts and stops itself (``openai`` is an endpoint that is already running).
LAUNCHED_ENGINES = ("sglang", "vllm", "transformers", "llamacpp", "command")
#: Launched engines that cannot be given an API key (so are never bound to a public address).
KEYLESS_ENGINES = ("transformers",)


#: Largest integer any setting takes (exact in JSON and in a float, and far below SQLite's limit).
MAX_INT = 2**53 - 1
#: Largest ``concurrency`` / ``max_concurrency``: requests in flight, all endpoints together.
MAX_CONCURRENCY = 1_000_000
#: Longest file name one path component may have (Linux NAME_MAX, bytes), and longest path (PATH_MAX).
NAME_MAX, PATH_MAX = 255, 4096


def check_path_text(value: str) -> str:
    """A path the system can open: no component over 255 bytes, the whole under 4096."""
    if len(value.encode("utf-8", "surrogateescape")) >= PATH_MAX:
        raise ValueError(f"is {len(value.encode())} bytes long; a path is at most {PATH_MAX - 1} bytes")
    for part in value.split("/"):
        n = len(part.encode("utf-8", "surrogateescape"))
        if n > NAME_MAX:
            raise ValueError(f"has a name of {n} bytes ({part[:24]}...); a file name is at most {NAME_MAX} bytes")
    return value


def secret_flag_problem(argv: list[str], field: str, engine: str | None = None) -> str | None:
    """Why ``argv`` may not hold a secret-looking flag (see :data:`harvest.redact.SECRET_FLAG`),
    in any spelling ``engine``'s parser reads as one (:mod:`harvest.engine_flags`; without a known
    engine, conservatively): every user on the machine reads a process's argv in /proc/PID/cmdline."""
    from harvest.engine_flags import argv_problem

    return argv_problem(engine, argv, field, binds=False)


def public_host_problem(host: str, engine: str, api_key_env: str | None, shown: str | None = None) -> str | None:
    """Why serving on ``host`` is refused (``shown`` says where the address was written, default
    ``host = '...'``): a non-loopback address needs an API key (``api_key_env``), and an engine that
    takes no key never gets one. None: allowed."""
    if is_loopback(host):
        return None
    where = shown or f"host = {host!r}"
    if engine in KEYLESS_ENGINES:
        return (f"{where} is not a loopback address, and engine '{engine}' takes no API key: "
                f"bind it to a loopback address (e.g. 127.0.0.1)")
    if not api_key_env:
        return (f"{where} is not a loopback address: serving it needs an API key (set "
                f"`api_key_env` to the environment variable holding it), or bind a loopback address "
                f"(e.g. 127.0.0.1)")
    return None


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` exposes the server to this machine only (no name resolution: any
    host name other than ``localhost`` counts as public, and so do ``0.0.0.0``, ``::`` and "")."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class StrictModel(BaseModel):
    # strict: a value of the wrong TOML type is an error, never coerced (`port = true` is not port
    # 1, `flag = "yes"` is not true); an integer still fills a float. No inf/nan: every timeout and
    # fraction is a finite number.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        # A NUL cannot be part of a path, an argv element or an environment variable.
        if _has_nul(value):
            raise ValueError("contains a NUL character (\\u0000)")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
            raise ValueError(f"{value} is out of range (at most {MAX_INT}, 2**53 - 1)")
        return value


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, (list, tuple)):
        return any(_has_nul(v) for v in value)
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    return False


def field_path(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """``loc`` without pydantic's tags of union members and validators (``int``, ``literal['auto']``,
    ``function-after[...]``): what is left names the table and the key."""
    tags = {"int", "float", "str", "bool", "list", "dict", "none", "json-or-python"}
    return tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p in tags)))


__all__ = [
    "EngineKind",
    "KEYLESS_ENGINES",
    "LAUNCHED_ENGINES",
    "MAX_CONCURRENCY",
    "MAX_INT",
    "NAME_MAX",
    "PATH_MAX",
    "StrictModel",
    "check_path_text",
    "field_path",
    "is_loopback",
    "public_host_problem",
    "secret_flag_problem",
]
