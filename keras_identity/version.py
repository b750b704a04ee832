"""The package's version: declared here once (setup.cfg reads it, the package
root and the loader's messages show it)."""

__version__ = "0.1.0"
