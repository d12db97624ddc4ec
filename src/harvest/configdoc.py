"""The configuration reference (``docs/config.md``), written from the config models themselves.

Every setting's text is its ``Field(description=...)`` in :mod:`harvest.config`; this module only
lays them out, one table per TOML table, with the type, the bounds and the default as TOML spells
them. ``scripts/config-docs`` writes the page; ``tests/test_configdoc.py`` fails when the page and
the models drift apart, or when a setting has no description.
"""

from __future__ import annotations

import json
import re
import types
import typing
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from harvest import config as cfg

#: The tables in the order a job file usually has them: (TOML header, model, what it is for).
TABLES: tuple[tuple[str, type[BaseModel]], ...] = (
    ("[server]", cfg.ServerConfig),
    ("[preflight]", cfg.PreflightConfig),
    ("[data]", cfg.DataConfig),
    ("[sampling]", cfg.SamplingConfig),
    ("[client]", cfg.ClientConfig),
    ("[run]", cfg.RunConfig),
    ("[output]", cfg.OutputConfig),
    ("[notify]", cfg.NotifyConfig),
    ("[host] / [[hosts]]", cfg.HostConfig),
    ("[cluster]", cfg.ClusterConfig),
)

HEADER = """\
# Configuration reference

<!-- Written by scripts/config-docs from the field descriptions in src/harvest/config/;
     tests/test_configdoc.py fails when they drift apart. Edit the descriptions, then run the script. -->

One TOML file, validated on load: a value of the wrong type, an unknown key or a value out of its
bounds is an error naming the file, the table and the field. An unknown key gets harvest's place for
it: the table it belongs in (`max_tokens` under `[server]`: a key of `[sampling]`), harvest's name
for another tool's (`max_new_tokens`, `tensor_parallel_size`, `binary`), or the closest key. Every
table is optional; each command says which it needs (`harvest run` needs `[data]`, and `[server]`
or `[client] endpoints`).
"""


def type_text(annotation: Any) -> str:
    """A field's type as a user writes it in TOML: ``int``, ``"auto" or int``, ``list of str``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        parts = [type_text(a) for a in args if a is not type(None)]
        return " or ".join(parts)
    if origin is list:
        return f"list of {type_text(args[0])}" if args else "list"
    if origin is dict:
        return "table"
    if annotation is typing.Any:
        return "any"
    name = getattr(annotation, "__name__", str(annotation))
    return {"str": "string", "bool": "true/false"}.get(name, name)


def bounds_text(field: FieldInfo) -> str:
    """``>= 1``, ``> 0, <= 1``: the numeric bounds pydantic enforces on the field."""
    out = []
    for meta in field.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(meta, attr, None)
            if value is not None:
                out.append(f"{sign} {value:g}" if isinstance(value, float) else f"{sign} {value}")
    return ", ".join(out)


def default_text(field: FieldInfo) -> str:
    """The default as TOML would spell it, or *required*, or *unset* for None."""
    if field.is_required():
        return "*required*"
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]  # list/dict/model factories take no argument
    else:
        value = field.default
    if value is None or value is PydanticUndefined:
        return "*unset*"
    if isinstance(value, BaseModel):
        return "(its table's defaults)"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    return f"`{json.dumps(value)}`" if isinstance(value, (str, list, dict)) else f"`{value:g}`" \
        if isinstance(value, float) else f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    """The whole page."""
    parts = [HEADER]
    for header, model in TABLES:
        doc = re.sub(r":\w+:`([^`]+)`", r"`\1`", " ".join((model.__doc__ or "").split())).replace("``", "`")
        parts.append(f"## `{header}`\n\n{doc}\n")
        parts.append("| setting | type | default | what it does |\n|---|---|---|---|")
        for name, field in model.model_fields.items():
            if field.exclude:
                continue
            kind = type_text(field.annotation)
            bounds = bounds_text(field)
            parts.append(f"| `{name}` | {_cell(kind)}{' (' + bounds + ')' if bounds else ''} | "
                         f"{_cell(default_text(field))} | {_cell(field.description or '')} |")
        parts.append("")
    return "\n".join(parts).rstrip("\n") + "\n"


def undocumented() -> list[str]:
    """``table.field`` of every setting without a description."""
    return [f"{header} {name}" for header, model in TABLES for name, field in model.model_fields.items()
            if not field.exclude and not (field.description or "").strip()]


__all__ = ["TABLES", "render", "undocumented"]
