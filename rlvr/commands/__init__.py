"""Subcommands of the `rlvr` CLI, one module each, and what they share (config_cli: loading a stage config from
YAML files and key=value overrides, and running a stage with its errors said)."""
