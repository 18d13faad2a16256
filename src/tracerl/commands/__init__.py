"""The `tracerl` command's subcommands, one module per group; each adds its commands with `register(app)`."""
