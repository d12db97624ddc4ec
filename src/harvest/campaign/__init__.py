"""The jobs harvest runs, one subpackage per part:

- ``run/``: a campaign, dataset -> ledger -> servers -> results, resumable (``session.py`` runs the
  session's steps in order: ``intake.py``, ``supervise.py``, ``dispatch.py``, with ``generate.py``
  for one item, ``breaker.py``, ``context.py``, ``order.py``, ``folder.py``, ``distill.py``);
- ``outputs/``: what a campaign leaves and shows, read by the commands that show it:
  ``progress.py`` (the panel and progress.json), ``phases.py``, ``timeline.py`` (timeline.json),
  ``status.py``, ``export.py`` and ``export_logprobs.py``;
- ``sweep/``: server settings under the quality gate, ``compare.py`` and ``tune.py``;
- ``demo.py``: the embedded demo's job and tiny model.

``outputs`` imports neither ``run`` nor ``sweep``, and ``run`` does not import ``sweep``
(.importlinter, contract ``campaign``).
"""
