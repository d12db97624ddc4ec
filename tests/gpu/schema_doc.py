"""The JSON Schemas documented in docs/json-schema.md, and a validator for the subset they use.

The document is the contract for ``--json`` output; tests validate real command output against
the schema blocks read from it, so the document and the code cannot drift apart silently.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[2] / "docs" / "json-schema.md"

_TYPES: dict[str, Any] = {
    "object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
    "integer": int, "number": (int, float),
}


def documented_schema(schema_id: str) -> dict[str, Any]:
    """The ```json block of docs/json-schema.md whose ``$id`` is ``schema_id``."""
    for block in re.findall(r"```json\n(.*?)```", DOC.read_text(), flags=re.S):
        schema = json.loads(block)
        if schema.get("$id") == schema_id:
            return schema
    raise AssertionError(f"{DOC} documents no schema with $id {schema_id!r}")


def _is(value: Any, type_name: str) -> bool:
    if isinstance(value, bool) and type_name in ("integer", "number"):
        return False
    return isinstance(value, _TYPES[type_name])


def problems(value: Any, schema: dict[str, Any], where: str = "$") -> list[str]:
    """Every way ``value`` breaks ``schema`` (type, const, enum, required, properties,
    additionalProperties, items); empty when it conforms."""
    out: list[str] = []
    if "const" in schema and value != schema["const"]:
        out.append(f"{where}: {value!r} != {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{where}: {value!r} not in {schema['enum']}")
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is(value, t) for t in types):
            out.append(f"{where}: {type(value).__name__} is not {'/'.join(types)}")
            return out
    if isinstance(value, dict):
        props = schema.get("properties", {})
        out += [f"{where}: missing {k!r}" for k in schema.get("required", []) if k not in value]
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                out += problems(item, props[key], f"{where}.{key}")
            elif extra is False:
                out.append(f"{where}: undocumented key {key!r}")
            elif isinstance(extra, dict):
                out += problems(item, extra, f"{where}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            out += problems(item, schema["items"], f"{where}[{i}]")
    return out


#: The command's document (every placement) -> the documented shape of each place's answer.
ANSWERS = {"harvest.gpus/2": "harvest.gpus/1", "harvest.preflight/2": "harvest.preflight/1"}


def place_answers(doc: dict[str, Any], schema_id: str) -> list[dict[str, Any] | None]:
    """Check a ``harvest gpus|preflight --json`` document (``schema_id``) and every place's answer
    against their documented shapes; returns the answers in place order (None: that place gave none)."""
    found = problems(doc, documented_schema(schema_id))
    inner = documented_schema(ANSWERS[schema_id])
    for i, place in enumerate(doc.get("places") or []):
        if isinstance(place, dict) and place.get("answer") is not None:
            found += problems(place["answer"], inner, f"$.places[{i}].answer")
    assert found == [], found
    return [p["answer"] for p in doc["places"]]


def only_answer(text: str) -> dict[str, Any]:
    """This machine's one answer in the printed ``harvest gpus|preflight --json`` document, checked."""
    doc = json.loads(text)
    (answer,) = place_answers(doc, doc.get("schema", "?"))
    assert doc["placement"] == "local" and doc["places"][0]["where"] == "this machine", doc
    assert answer is not None, doc
    return answer
