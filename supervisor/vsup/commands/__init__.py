"""One module per `vsup` command: `register(subparsers)` and a `run(args)` it sets as `func`."""
