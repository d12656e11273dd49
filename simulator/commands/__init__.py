"""One module per `stepsim` subcommand: each has add_parser(subparsers) and run(args) -> int."""
