"""The tune file: what ``harvest tune --grid`` sweeps and ``harvest compare --settings`` reads.

    tune_file = load_tune_file("tune.toml")   # ConfigError naming the file, table and field
    tune_file.grid                             # [grid] tables: a [server] field -> its values
    tune_file.quality                          # [probe], [gate], [task], [policy] as QualitySettings

Tables: ``[grid]`` (or ``[[grid]]``, joined), ``[reference]`` (overrides on the job's [server] that
make the reference), ``[probe]``, ``[gate]``, ``[task]``, ``[policy]``
(:mod:`harvest.quality.settings`), ``[throughput]`` (:mod:`harvest.quality.throughput`) and
``[sweep]`` (:class:`SweepSettings`). A relative ``[probe] file`` is relative to the tune file.
Only reads and validates; running the sweep is :mod:`harvest.campaign.sweep.tune`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from harvest.config import ServerConfig
from harvest.errors import ConfigError
from harvest.quality.settings import (
    GateSettings,
    PolicySettings,
    ProbeSettings,
    QualitySettings,
    TaskSettings,
)
from harvest.quality.throughput import ThroughputSettings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


class SweepSettings(BaseModel):
    """``[sweep]``: how the sweep treats a dirty stop, and sampling of a large grid."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: After a dirty stop: end the sweep ("abort") or launch the next trial anyway ("continue").
    on_dirty_stop: Literal["abort", "continue"] = "abort"
    #: Run at most this many trials, drawn from the grid by a seeded sample (order kept).
    max_trials: int | None = Field(None, ge=1)
    sample_seed: int = 0


class TuneFile(BaseModel):
    """A tune file: the grid, the reference, the probes, the gate and the policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    grid: list[dict[str, list[Any]]] = Field(default_factory=list)
    #: Overrides on the job's [server] that make the reference (default: the job's server as is).
    reference: dict[str, Any] = Field(default_factory=dict)
    probe: ProbeSettings = Field(default_factory=ProbeSettings)
    gate: GateSettings = Field(default_factory=GateSettings)
    task: TaskSettings = Field(default_factory=TaskSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings)
    throughput: ThroughputSettings = Field(default_factory=ThroughputSettings)
    sweep: SweepSettings = Field(default_factory=SweepSettings)
    source: str = Field("<memory>", exclude=True)

    @field_validator("grid", mode="before")
    @classmethod
    def _tables(cls, value: Any) -> Any:
        tables = [value] if isinstance(value, dict) else value
        if not isinstance(tables, list):
            raise ValueError("[grid] must be a table or an array of tables")
        for table in tables:
            if not isinstance(table, dict):
                raise ValueError("[grid] must be a table or an array of tables")
            for key, values in table.items():
                if key not in ServerConfig.model_fields:
                    raise ValueError(f"{key!r} is not a [server] field")
                if not isinstance(values, list) or not values:
                    raise ValueError(f"{key} must list its values (a non-empty array)")
        return tables

    @property
    def quality(self) -> QualitySettings:
        return QualitySettings(probe=self.probe, gate=self.gate, task=self.task, policy=self.policy)


def parse_tune_file(data: dict[str, Any], source: str = "<memory>", base: Path | None = None) -> TuneFile:
    """Validate a parsed tune file. Raises ConfigError naming the table and field."""
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    probe = data.get("probe")
    if base is not None and isinstance(probe, dict) and isinstance(probe.get("file"), str):
        path = Path(probe["file"]).expanduser()
        probe["file"] = str(path if path.is_absolute() else base / path)
    try:
        return TuneFile.model_validate({**data, "source": source})
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = [str(p) for p in err["loc"]]
            where = source
            if loc:
                where = f"{source} [{loc[0]}]" + (" " + ".".join(loc[1:]) if len(loc) > 1 else "")
            problems.append((where, "unknown field" if err["type"] == "extra_forbidden" else err["msg"]))
        raise ConfigError(source, problems) from None


def load_tune_file(path: str | Path) -> TuneFile:
    """Read and validate a tune file. Raises ConfigError: unreadable, not TOML, or a bad table or field."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(str(path), [(str(path), f"cannot read: {exc.strerror or exc}")]) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), [(str(path), f"TOML syntax: {exc}")]) from None
    return parse_tune_file(data, source=str(path), base=path.resolve().parent)


__all__ = ["SweepSettings", "TuneFile", "load_tune_file", "parse_tune_file"]
