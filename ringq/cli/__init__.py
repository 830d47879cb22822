"""The ``ringq`` command line (docs/cli.md)."""

from .main import main

__all__ = ["main"]
