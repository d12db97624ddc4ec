"""What a campaign leaves in its run folder and shows: the live panel and progress.json, the phases,
timeline.json, ``harvest status`` and ``harvest export``. Nothing here runs a campaign."""
