"""Server settings under the quality gate: ``harvest compare`` (candidates against a reference)
and ``harvest tune`` (a grid swept for throughput, each point gated).

- ``compare.py`` and ``tune.py``: the two jobs, each with its report (rows; trials and the best);
  neither imports the other;
- ``launch.py``: one launch and its verified stop (``launch_and_run``, ``Launch``), a sweep's
  launches in order through one placement (``Launches``), and the verdict on a launched setting
  (``judge``);
- ``bench.py``: the probe set, the reference and the noise floor of a sweep folder (``QualityBench``);
- ``report.py``: the fields both reports share (``SweepReport``);
- ``tune_file.py``: the tune file (``TuneFile``, ``load_tune_file``), read by tune and by
  ``harvest compare --settings``.
"""
