"""Command-line programs: ``python -m experiments.<name>`` from the repository root."""
