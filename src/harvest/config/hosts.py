"""``[host]`` / ``[[hosts]]`` and ``[cluster]``: the boxes (over SSH, and/or inside a container) and
the Ray cluster the servers run on. Which of them a command uses is decided once, by
:mod:`harvest.placement`; these models only describe what the file says.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from harvest.config.base import StrictModel, field_path
from harvest.config.server import ServerConfig
from harvest.errors import ConfigError


class HostConfig(StrictModel):
    """Where the server runs: a box reached over SSH (``ssh``) and/or a container entered with an
    exec prefix. The far side runs harvest's own JSON commands; see :mod:`harvest.placement.ssh`."""

    ssh: str | None = Field(None, description="`user@name` or a name from ~/.ssh/config; unset: this machine "
                            "(with `exec_prefix` only)")
    port: int = Field(22, ge=1, le=65535, description="the SSH port")
    identity_file: str | None = Field(None, description="the SSH key file (ssh -i)")
    ssh_options: list[str] = Field(default_factory=list, description="more `-o` options for OpenSSH's client, "
                                   "each `Key=Value` (they win over harvest's own)")
    exec_prefix: list[str] = Field(default_factory=list, description="argv run before every far command, e.g. "
                                   "[\"pct\", \"exec\", \"101\", \"--\"]")
    harvest: str = Field("harvest", description="the harvest executable on the far side (after the prefix)")
    forward_to: str = Field("127.0.0.1", description="the address the data tunnel forwards to on the far side "
                            "(a container's own address)")
    connect_timeout: float = Field(10.0, gt=0, description="seconds to establish the SSH connection (TCP, "
                                   "banner, key exchange)")
    command_timeout: float = Field(120.0, gt=0, description="seconds one far command may take beyond the "
                                   "connection (a launch adds its ready_timeout)")
    name: str | None = Field(None, description="a label for tables and messages (default: `ssh` or `local`)")
    server: dict[str, Any] = Field(default_factory=dict, description="fields of [server] that differ on this "
                                   "host (`port`, a far `model` path, `command`...)")

    def server_config(self, base: ServerConfig) -> ServerConfig:
        """``base`` with this host's overrides; a bad override is a ConfigError naming the host."""
        if not self.server:
            return base
        try:
            return ServerConfig.model_validate({**base.model_dump(), **self.server})
        except ValidationError as exc:
            where = f"[host {self.label}] server"
            raise ConfigError(where, [(f"{where}.{'.'.join(str(p) for p in field_path(tuple(e['loc'])))}",
                                       e["msg"].removeprefix("Value error, ")) for e in exc.errors()]) from None

    @field_validator("ssh_options")
    @classmethod
    def _key_value(cls, v: list[str]) -> list[str]:
        for opt in v:
            if "=" not in opt or opt.startswith("-"):
                raise ValueError(f"{opt!r}: each SSH option is Key=Value (passed as -o Key=Value)")
        return v

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        if self.ssh is None:
            return "local" + (f" ({self.exec_prefix[0]})" if self.exec_prefix else "")
        return self.ssh + (f":{self.port}" if self.port != 22 else "")


class ClusterConfig(StrictModel):
    """A Ray cluster the servers run on (see :mod:`harvest.placement.ray.servers`); needs the ray extra."""

    backend: Literal["ray"] = Field("ray", description="the cluster kind (Ray only)")
    address: str = Field("auto", description="auto (the cluster this machine belongs to, `ray start`), "
                         "HOST:PORT or ray://HEAD:10001")
    servers: int | Literal["per_node"] = Field(1, description="servers to place, or \"per_node\": one on each "
                                               "node with room for one")
    gpus_per_server: int = Field(1, ge=0, description="GPUs of each server (its tensor-parallel ranks), from "
                                 "Ray's assignment; 0 for CPU engines")
    resources: dict[str, float] = Field(default_factory=dict, description="custom Ray resources each server's "
                                        "bundle asks for besides one CPU and its GPUs")
    runtime_env: dict[str, Any] = Field(default_factory=dict, description="Ray runtime_env of the servers' "
                                        "actors (env_vars, py_modules...): harvest must be importable on "
                                        "every node, the same version as here")
    namespace: str = Field("harvest", description="Ray namespace of the servers' named actors and placement "
                           "groups")
    connect_timeout: float = Field(60.0, gt=0, description="seconds to connect to the cluster, for each "
                                   "node's answer to gpus and preflight (--timeout replaces it there), "
                                   "and to wait for a placement")

    @field_validator("servers")
    @classmethod
    def _servers(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError('must be >= 1 or "per_node"')
        return v

    @field_validator("resources")
    @classmethod
    def _resources(cls, v: dict[str, float]) -> dict[str, float]:
        for name, amount in v.items():
            if name in ("CPU", "GPU", "memory", "object_store_memory"):
                raise ValueError(f"{name!r} is a Ray default resource: set gpus_per_server instead")
            if amount <= 0:
                raise ValueError(f"{name} = {amount:g}: an amount must be > 0")
        return v

    def bundle(self) -> dict[str, float]:
        """The one bundle of a server's placement group."""
        out: dict[str, float] = {"CPU": 1.0}
        if self.gpus_per_server:
            out["GPU"] = float(self.gpus_per_server)
        out.update({k: float(v) for k, v in self.resources.items()})
        return out


__all__ = ["ClusterConfig", "HostConfig"]
