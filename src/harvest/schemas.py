"""The names of every JSON document harvest prints or reads back (``--json``, far answers, records).

One place for the ``schema`` strings, so that a near harvest, a far harvest and the documentation
(docs/json-schema.md) cannot drift apart. Change a shape: bump its number here and in the document.
"""

from __future__ import annotations

VERSION = "harvest.version/1"
#: One place's measurement / check: the ``answer`` of each place in the documents below.
GPUS = "harvest.gpus/1"
PREFLIGHT = "harvest.preflight/1"
#: ``harvest gpus|preflight --json``, the same shape on every placement: one answer per place.
GPUS_PLACES = "harvest.gpus/2"
PREFLIGHT_PLACES = "harvest.preflight/2"
SERVE = "harvest.serve/2"
STOP = "harvest.stop/1"
PS = "harvest.ps/1"
STATUS = "harvest.status/1"
#: What ``[notify]`` sends (docs/notify.md), and a run folder's record of who runs it (runner.json).
NOTIFY = "harvest.notify/1"
RUNNER = "harvest.runner/1"
PLACEMENT_RECORD = "harvest.placement/1"

#: What a far harvest answers to each JSON command (checked on the near side).
FAR = {"version": VERSION, "gpus": GPUS_PLACES, "preflight": PREFLIGHT_PLACES, "serve": SERVE, "stop": STOP, "ps": PS}



def version_payload() -> dict[str, object]:
    """The ``harvest version --json`` document: what a far harvest is compared on."""
    from harvest.version import __version__

    return {"schema": VERSION, "version": __version__, "schemas": dict(FAR)}


__all__ = ["FAR", "GPUS", "GPUS_PLACES", "NOTIFY", "PLACEMENT_RECORD", "PREFLIGHT", "PREFLIGHT_PLACES", "PS",
           "RUNNER", "SERVE", "STATUS", "STOP", "VERSION", "version_payload"]
