"""Explore a dataset version in the browser: funnel, galleries by any filter, images and their families.

    python pipelines/explore.py runs/demo/curated                        # http://127.0.0.1:8765/
    python pipelines/explore.py runs/c --against runs/a --port 8800      # and what changed from a
    python pipelines/explore.py a1191187dc9fc10f --tracking-uri sqlite:///runs/demo/mlflow.db

A version is an output folder, or a dataset version id or name registered in MLflow
(``--tracking-uri``, else ``$MLFLOW_TRACKING_URI``). The first start builds the version's index
(key ranges per manifest part, duplicate families) into the cache folder; later starts reuse it.
The server binds 127.0.0.1 unless ``--host`` says otherwise (then anyone who can reach that
address can read the version's images: a warning says so). ``--port 0`` picks a free port; the
URL is printed once the server listens. Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys

from curation.audit.explore_query import ExploreConfig
from curation.audit.loading import load_version

LOOPBACK = "127.0.0.1"


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("version", help="output folder, or dataset version id or name")
    p.add_argument("--against", help="an earlier version: list the images whose fate differs, and why")
    p.add_argument("--annotations", help="an annotation output of this version: shown on each image's page")
    p.add_argument("--host", default=LOOPBACK, help=f"address to bind (default {LOOPBACK}: this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0: any free port)")
    p.add_argument("--tracking-uri", help="MLflow store to resolve version ids and names")
    p.add_argument("--cache-dir", default="", help="where indexes and thumbnails go (default: the user's cache)")
    p.add_argument("--page-size", type=int, default=ExploreConfig.page_size, help="images per gallery page")
    p.add_argument("--memory-limit", default=ExploreConfig.memory_limit, help="DuckDB's memory limit (e.g. 1GB)")
    return p.parse_args(argv)


def listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)  # connections wait in the backlog until the server accepts them
    return sock


def serve(app, sock: socket.socket, host: str) -> None:
    import uvicorn

    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    shown = f"[{host}]" if ":" in host else host
    print(f"explorer: http://{shown}:{port}/", flush=True)
    server.run(sockets=[sock])


def open_session(args: argparse.Namespace, cfg: ExploreConfig):
    from pipelines.explorer.session import ExploreSession

    version = load_version(args.version, args.tracking_uri)
    against = load_version(args.against, args.tracking_uri) if args.against else None
    return ExploreSession.open(version, cfg, against, args.annotations)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not is_loopback(args.host):
        print(
            f"WARNING: serving on {args.host}, not {LOOPBACK}: anyone who can reach it can read this version's "
            "images and manifest (there is no login)",
            file=sys.stderr,
            flush=True,
        )
    try:
        cfg = ExploreConfig(page_size=args.page_size, memory_limit=args.memory_limit, cache_dir=args.cache_dir)
        sock = listen(args.host, args.port)  # first: a taken port or a foreign address fails before any work
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        session = open_session(args, cfg)
    except (ValueError, OSError) as err:
        sock.close()
        print(f"error: {err}", file=sys.stderr)
        return 2
    version = session.version
    index = session.explored.query.index.header
    print(
        f"dataset version {version.id} ({version.uri}): {index['rows']:,} rows in {index['parts']:,} manifest parts; "
        f"opened in {session.opened_s:.1f} s (index in {session.explored.query.folder})",
        flush=True,
    )
    from pipelines.explorer.app import create_app

    serve(create_app(session), sock, args.host)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    sys.exit(main())
