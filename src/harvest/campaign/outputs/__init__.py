"""What a campaign leaves in its run folder and tells its display: progress.json and the snapshots a
display is fed (the panel itself is the command line's, ``cli/panel.py``), timeline.json,
``harvest status`` and ``harvest export``. Nothing here runs a campaign or draws."""
