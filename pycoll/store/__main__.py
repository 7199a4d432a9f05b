"""``python -m pycoll.store``: run a standalone pycoll TCP store until interrupted."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Optional, Sequence, cast

from ..errors import StoreError
from ._wire import DEFAULT_MAX_MESSAGE
from .tcp_server import TCPStoreServer


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pycoll.store",
        description="Run a standalone pycoll TCP store. The token comes from PYCOLL_STORE_TOKEN "
                    "(a random one is made and printed when it is unset).")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    parser.add_argument("--port", type=int, default=0, help="TCP port (default: a free one)")
    parser.add_argument("--max-message", type=int, default=DEFAULT_MAX_MESSAGE, help="request size limit, bytes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="pycoll.store: %(message)s")
    token = os.environ.get("PYCOLL_STORE_TOKEN") or None
    try:
        server = TCPStoreServer(args.host, args.port, token, max_message=args.max_message)
    except ValueError as exc:  # a bad argument or token
        parser.error(str(exc))
    except StoreError as exc:  # cannot listen there (the port in use, an address not this host's)
        sys.stderr.write(f"python -m pycoll.store: {exc}\n")
        return 1
    sys.stdout.write(f"PYCOLL_STORE_ADDR={server.host}\nPYCOLL_STORE_PORT={server.port}\n")
    if token is None:
        sys.stdout.write(f"PYCOLL_STORE_TOKEN={cast(str, server.token)}\n")  # the server made it: a hex str
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
