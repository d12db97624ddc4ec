"""``python -m harvest`` runs the command-line interface."""

from harvest.cli.main import main

main()
