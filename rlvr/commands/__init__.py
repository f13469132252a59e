"""Subcommands of the `rlvr` CLI, one module each."""
