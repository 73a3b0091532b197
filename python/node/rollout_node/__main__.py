"""``python -m rollout_node``: ``rollout node``'s command line in Python. Exit 0 after the
trainer's ``shutdown``, or after leaving the run on SIGTERM or SIGINT (``leave``, PROTOCOL.md
§5), 2 on bad flags or no token, 1 on any failure after the start; the error is one
``error: ...`` line on stderr, as ``rollout node`` writes it."""

import argparse
import importlib
import os
import socket
import sys

from . import wire
from .session import JoinError, Session
from .session import tls_context as session_tls_context


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def parse(argv):
    """The flags; ``rollout node``'s where they apply, plus ``--import``."""
    p = _Parser(prog="python -m rollout_node", description="Join a trainer as a node and serve it until it shuts down")
    p.add_argument("--join", required=True, metavar="HOST:PORT", help="The trainer's address, HOST:PORT")
    p.add_argument("--token-file", metavar="PATH", help="File holding the shared token (else the ROLLOUT_TOKEN env var)")
    p.add_argument(
        "--allow-insecure-token-file", action="store_true",
        help="Accept a token file readable by group or others",
    )
    p.add_argument("--name", help="Name shown in the trainer's logs [default: host:pid]")
    p.add_argument("--index", type=int, metavar="I", help="Ask for this node index (a node rejoining its slot)")
    p.add_argument("--connect-timeout", type=float, default=30.0, metavar="SECS", help="Give up connecting after this many seconds")
    p.add_argument("--tls-ca", metavar="PEM", help="Join over TLS: the CA certificates the trainer's certificate must chain to")
    p.add_argument("--tls-server-name", metavar="NAME", help="The name the trainer's certificate must hold [default: the host of --join]")
    p.add_argument("--tls-cert", metavar="PEM", help="Mutual TLS: this node's certificate chain, with --tls-key")
    p.add_argument("--tls-key", metavar="PEM", help="Mutual TLS: this node's private key, with --tls-cert")
    p.add_argument(
        "--import", dest="imports", action="append", default=[], metavar="MODULE",
        help="Import MODULE first (it registers envs with gymnasium); repeatable",
    )
    p.add_argument(
        "--double-to-float", action="store_true",
        help="Report and collect f64 boxes as f32 (torchrl's DoubleToFloat)",
    )
    p.add_argument(
        "--allow-pickled-env", action="store_true",
        help="Run a torchrl env the trainer sends as a pickle (it runs the trainer's code on this host; "
             "needs torchrl and cloudpickle)",
    )
    return p.parse_args(argv)


def main(argv=None):
    """Runs the node; returns the exit status."""
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        token = wire.read_token(args.token_file, args.allow_insecure_token_file)
    except wire.TokenError as e:
        print(f"error: invalid `token`: {e}", file=sys.stderr)
        return 2
    if not (args.connect_timeout >= 0):
        print(f"error: invalid `connect_timeout`: {args.connect_timeout} is not a number of seconds", file=sys.stderr)
        return 2
    if args.index is not None and args.index < 0:
        print(f"error: invalid `index`: {args.index} is negative", file=sys.stderr)
        return 2
    tls = None
    if args.tls_ca is not None:
        try:
            tls = session_tls_context(args.tls_ca, args.tls_cert, args.tls_key)
        except ValueError as e:
            field, _, why = str(e).partition(": ")
            print(f"error: invalid `{field}`: {why}", file=sys.stderr)
            return 2
    elif args.tls_cert or args.tls_key or args.tls_server_name:
        print("error: invalid `tls_ca`: required with --tls-cert, --tls-key or --tls-server-name", file=sys.stderr)
        return 2
    for m in args.imports:
        try:
            importlib.import_module(m)
        except Exception as e:
            print(f"error: invalid `import`: cannot import {m}: {e}", file=sys.stderr)
            return 2
    name = args.name or f"{socket.gethostname()}:{os.getpid()}"
    try:
        # Nodes come and go: SIGTERM or SIGINT leaves the run cleanly, as `rollout node` does.
        Session(
            args.join, token, name, args.index, args.connect_timeout, leave_on_signals=True,
            double_to_float=args.double_to_float, allow_pickled_env=args.allow_pickled_env,
            tls=tls, server_name=args.tls_server_name,
        ).run()
    except JoinError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
