"""Export and serving programs: ``python -m export.<name>`` from the repository root."""
