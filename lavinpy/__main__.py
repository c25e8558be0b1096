"""`lavinpy` / `python -m lavinpy`: run the broker."""

from __future__ import annotations

import argparse
import os
import sys

from . import __version__, config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lavinpy", description="AMQP 0-9-1 message broker")
    config.add_arguments(parser)
    parser.add_argument("--version", action="version", version=f"lavinpy {__version__}")
    args = parser.parse_args(argv)
    try:
        cfg = config.from_args(args)
    except config.ConfigError as e:
        print(f"lavinpy: {e}", file=sys.stderr)
        return 2
    from .server import run

    # Files are created owner-only explicitly; the umask also covers any file a future change forgets.
    os.umask(0o077)

    return run(cfg)


if __name__ == "__main__":
    sys.exit(main())
