"""``python -m rollout node``: ``rollout node`` from the wheel, a Rust node (the same code)
in this interpreter's extension, so a pip user's ``process`` and ``slurm`` launchers need
no ``rollout`` binary. Its flags and exit statuses are ``rollout node``'s: 0 after the
trainer's ``shutdown`` or after leaving on SIGTERM/SIGINT, 2 on bad flags or no token (one
``error: ...`` line), 1 on any failure after the start."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import List, Optional


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m rollout", description="rollout's Rust node, from the Python package")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    n = sub.add_parser("node", help="Join a trainer as a node and serve it until it shuts down")
    n.add_argument("--join", required=True, metavar="HOST:PORT", help="The trainer's address, HOST:PORT")
    n.add_argument("--token-file", metavar="PATH", help="File holding the shared token (else the ROLLOUT_TOKEN env var)")
    n.add_argument("--allow-insecure-token-file", action="store_true", help="Accept a token file readable by group or others")
    n.add_argument("--name", help="Name shown in the trainer's logs [default: host:pid]")
    n.add_argument("--index", type=int, metavar="I", help="Ask for this node index (a node rejoining its slot)")
    n.add_argument("--connect-timeout", type=float, default=30.0, metavar="SECS", help="Give up connecting after this many seconds")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the command; returns the exit status."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.index is not None and args.index < 0:
        print(f"error: invalid `index`: {args.index} is negative", file=sys.stderr)
        return 2
    # The node's warnings and errors on stderr, as `rollout node` writes them.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from . import _native
    from ._native import CollectorError, ConfigError

    try:
        _native.run_node(
            args.join, args.token_file, args.allow_insecure_token_file, args.name, args.index, args.connect_timeout
        )
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except CollectorError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # SIGINT reached the node, which left the run (its `leave` sent): a clean exit.
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
