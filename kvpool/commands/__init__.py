"""Subcommands of the kvpool CLI, one module each (see kvpool/cli.py)."""
