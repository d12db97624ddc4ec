"""``HarvestConfig``: one whole configuration file, its tables together and the rules that span
them (one credential, one host form, log-probabilities within what the engine returns), with
``far_hosts()``, the hosts the file names.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from harvest.config.base import StrictModel
from harvest.config.hosts import ClusterConfig, HostConfig
from harvest.config.job import (
    ClientConfig,
    DataConfig,
    OutputConfig,
    PreflightConfig,
    RunConfig,
    SamplingConfig,
)
from harvest.config.notify import NotifyConfig
from harvest.config.server import ServerConfig, engine_logprobs_limit
from harvest.errors import ConfigError


class HarvestConfig(StrictModel):
    """A whole harvest configuration file. Every table is optional; commands say which they need."""

    server: ServerConfig | None = None
    preflight: PreflightConfig = Field(default_factory=PreflightConfig)
    data: DataConfig | None = None
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    client: ClientConfig = Field(default_factory=ClientConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    notify: NotifyConfig = Field(default_factory=NotifyConfig)
    host: HostConfig | None = None
    hosts: list[HostConfig] = Field(default_factory=list)
    cluster: ClusterConfig | None = None
    #: The file this configuration came from (not a TOML field).
    source: str = Field("<memory>", exclude=True)

    def recorded(self) -> dict[str, Any]:
        """The configuration as JSON, fit to write down: secrets in ``[server]``, and in every
        table secrets by shape (:func:`harvest.redact.redact_doc`: URL user parts and query keys,
        header-like keys and values in ``[sampling] extra_body``, secret-named variables in
        ``[cluster] runtime_env.env_vars``) redacted."""
        from harvest.redact import hide_url_path, redact_doc

        data = self.model_dump(mode="json", exclude={"source"})
        server = self.server.recorded() if self.server is not None else None
        if data["notify"].get("url"):  # a webhook's path is its key (hooks.slack.com/services/T/B/KEY)
            data["notify"]["url"] = hide_url_path(data["notify"]["url"])
        return {table: server if table == "server" else redact_doc(value) for table, value in data.items()}

    @model_validator(mode="after")
    def _one_credential(self) -> HarvestConfig:
        from harvest.redact import URL_USER, redact_text

        if self.server is not None and self.server.api_key_env:
            for url in [self.server.base_url or "", *self.client.endpoints]:
                if URL_USER.search(url):  # a user part, with or without a password: basic auth
                    raise ValueError(f"{redact_text(url)} carries a password (a user part) and [server] "
                                     f"api_key_env names a key: give one credential (the key, through api_key_env)")
        return self

    @model_validator(mode="after")
    def _one_host_form(self) -> HarvestConfig:
        if self.host is not None and self.hosts:
            raise ValueError("use either [host] or [[hosts]], not both")
        if self.cluster is not None and (self.host is not None or self.hosts):
            raise ValueError("use either [cluster] or [host] / [[hosts]], not both: on a Ray cluster "
                             "Ray places the servers")
        return self

    @model_validator(mode="after")
    def _logprobs_within_engine(self) -> HarvestConfig:
        limit = engine_logprobs_limit(self.server)
        if limit is not None and self.sampling.logprobs > limit[0]:
            raise ValueError(f"[sampling] logprobs = {self.sampling.logprobs} is above what {limit[1]}")
        return self

    def far_hosts(self) -> list[HostConfig]:
        """The hosts the server runs on: [[hosts]], else [host], else none (this machine)."""
        return list(self.hosts) if self.hosts else ([self.host] if self.host is not None else [])

    def require_server(self) -> ServerConfig:
        if self.server is None:
            raise ConfigError(self.source, [(f"{self.source} [server]", "this command needs a [server] table")])
        return self.server


__all__ = ["HarvestConfig"]
