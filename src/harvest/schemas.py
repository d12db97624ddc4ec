"""The names of every JSON document harvest prints or reads back (``--json``, far answers, records).

One place for the ``schema`` strings, so that a near harvest, a far harvest and the documentation
(docs/json-schema.md) cannot drift apart. Change a shape: bump its number here and in the document.
"""

from __future__ import annotations

VERSION = "harvest.version/1"
GPUS = "harvest.gpus/1"
PREFLIGHT = "harvest.preflight/1"
SERVE = "harvest.serve/2"
STOP = "harvest.stop/1"
PS = "harvest.ps/1"
STATUS = "harvest.status/1"
GPUS_HOSTS = "harvest.gpus-hosts/1"
PREFLIGHT_HOSTS = "harvest.preflight-hosts/1"
PS_HOSTS = "harvest.ps-hosts/1"
GPUS_CLUSTER = "harvest.gpus-cluster/1"
PREFLIGHT_CLUSTER = "harvest.preflight-cluster/1"
PLACEMENT_RECORD = "harvest.placement/1"

#: What a far harvest answers to each JSON command (checked on the near side).
FAR = {"version": VERSION, "gpus": GPUS, "preflight": PREFLIGHT, "serve": SERVE, "stop": STOP, "ps": PS}



def version_payload() -> dict[str, object]:
    """The ``harvest version --json`` document: what a far harvest is compared on."""
    from harvest import __version__

    return {"schema": VERSION, "version": __version__, "schemas": dict(FAR)}


__all__ = ["FAR", "GPUS", "GPUS_CLUSTER", "GPUS_HOSTS", "PLACEMENT_RECORD", "PREFLIGHT", "PREFLIGHT_CLUSTER",
           "PREFLIGHT_HOSTS", "PS", "PS_HOSTS", "SERVE", "STATUS", "STOP", "VERSION", "version_payload"]
