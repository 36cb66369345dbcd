"""``python -m mooncake.http_metadata_server [--host H] [--port P]``: gpu_rdma's server of
Mooncake's HTTP metadata protocol (:class:`gpu_rdma.MetadataServer`), with the command line
of Mooncake's own; it serves until interrupted (SIGINT or SIGTERM)."""

import argparse
import signal
import socket
import sys
import threading
from typing import List, Optional

from gpu_rdma import MetadataServer


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the server until SIGINT or SIGTERM."""
    p = argparse.ArgumentParser(description="HTTP metadata server (gpu_rdma)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on")
    p.add_argument("--host", default="0.0.0.0", help="address to bind to")
    p.add_argument("--log-level", default="INFO", help="accepted for Mooncake's command line")
    args = p.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    host = socket.gethostbyname(args.host)
    with MetadataServer(f"{host}:{args.port}") as server:
        if host == "0.0.0.0":
            print(
                f"HTTP metadata server at {server.url} (every address: agents name it "
                f"http://<this host's address>:{args.port}/metadata)",
                flush=True,
            )
        else:
            print(f"HTTP metadata server at {server.url}", flush=True)
        while not stop.wait(1.0):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
