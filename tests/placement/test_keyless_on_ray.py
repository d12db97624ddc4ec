"""A server on a Ray node binds the node's address, so the driver checks, before placing anything,
that an engine which takes no API key is never asked to serve a node whose address is not loopback
(and that a keyed engine has its key). The check runs on the driver with the cluster's real node
list; here the node list is given (a connection seam), and nothing is placed: the test sees the
error and that no placement group was asked for."""

from __future__ import annotations

from pathlib import Path

import pytest

from harvest.config import parse_config
from harvest.placement.ray.cluster import ClusterError
from harvest.placement.ray.servers import RayServerGroup, check_node_addresses


class Nodes:
    """A connection that answers with these nodes; placing anything through it fails the test."""

    def __init__(self, *addresses: str):
        self.nodes = [{"NodeID": f"{i:02d}" * 14, "NodeManagerAddress": a, "Alive": True,
                       "Resources": {"CPU": 4.0, "GPU": 1.0}} for i, a in enumerate(addresses)]
        self.closed = False

    def connect(self) -> None:
        pass

    def alive_nodes(self) -> list[dict]:
        return self.nodes

    def close(self) -> None:
        self.closed = True

    def __getattr__(self, name: str):  # ray, get_actor, placement_group, ...: nothing may be placed
        raise AssertionError(f"the driver went on to {name!r} after a refusal")


def job(tmp_path: Path, engine: str, **server: object):
    table = {"engine": engine, "model": "/models/m", "port": 8000, **server}
    return parse_config({"server": table, "cluster": {"backend": "ray", "address": "10.0.0.1:6379"},
                         "output": {"dir": str(tmp_path / "run")}}, source="job.toml", base=tmp_path)


def plan(tmp_path: Path, cfg, conn: Nodes) -> ClusterError:
    group = RayServerGroup(cfg, cfg.require_server(), run_dir=tmp_path / "run" / "server", conn=conn)  # type: ignore[arg-type]
    with pytest.raises(ClusterError) as info:
        group._plan()
    assert not (tmp_path / "run" / "server").exists()  # nothing placed, no record
    return info.value


def test_a_keyless_engine_on_a_non_loopback_node_is_refused_before_placement(tmp_path):
    cfg = job(tmp_path, "transformers")
    err = plan(tmp_path, cfg, Nodes("10.0.0.5"))
    text = str(err)
    assert "\n" not in text
    assert "engine 'transformers' takes no API key" in text and "10.0.0.5" in text
    assert text.startswith("job.toml [server] engine:")


def test_a_keyed_engine_without_its_key_is_refused_naming_the_node(tmp_path):
    err = plan(tmp_path, job(tmp_path, "vllm"), Nodes("127.0.0.1", "10.0.0.7"))
    assert "api_key_env" in str(err) and "10.0.0.7" in str(err) and "127.0.0.1" not in str(err).split(":", 1)[1]


def test_loopback_nodes_need_no_key():
    from harvest.config import ServerConfig

    check_node_addresses("job.toml", ServerConfig(engine="transformers", model="m"), [])  # nothing public: fine
    with pytest.raises(ClusterError):
        check_node_addresses("job.toml", ServerConfig(engine="transformers", model="m"), ["192.168.1.2"])


def test_an_error_raised_on_a_node_reaches_the_user_whole():
    """Ray hands the driver the node's exception (``cause``) inside its own wrapper: the words
    shown are every field and message of a validation error, never pydantic's last line only."""
    from pydantic import ValidationError

    from harvest.config import ServerConfig
    from harvest.errors import ConfigError
    from harvest.placement.ray.cluster import short_error

    def invalid(table: dict) -> ValidationError:
        try:
            ServerConfig.model_validate(table)
        except ValidationError as exc:
            return exc
        raise AssertionError(f"{table} validated")

    class RayTaskError(Exception):  # the wrapper's shape: a traceback text, the cause attached
        def __init__(self, cause: BaseException):
            super().__init__("ray::ServerActor.launch()\nTraceback (most recent call last):\n  ...\n" + str(cause))
            self.cause = cause

    text = short_error(RayTaskError(invalid({"engine": "transformers", "model": "m", "host": "10.0.0.5"})))
    assert "For further information" not in text and "Traceback" not in text
    assert "takes no API key" in text and "10.0.0.5" in text, text
    text = short_error(RayTaskError(invalid({"engine": "vllm", "model": "m", "port": 0, "tp": 0})))
    assert "port:" in text and "tp:" in text and "greater than or equal to 1" in text, text  # every field
    problems = short_error(RayTaskError(ConfigError("job.toml", [("job.toml [server] model", "no such file")])))
    assert problems == "job.toml [server] model: no such file"
