"""``drift-audit serve``: the webhook app and its worker pool in one process."""

from __future__ import annotations

import argparse
import sys
import threading


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the GitHub App webhook service")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (default: %(default)s)")
    p.add_argument("--db", help="job database path (default: the settings' 'db', else drift-audit.db)")
    p.add_argument("--settings", metavar="FILE", help="TOML settings file (DRIFT_AUDIT_* variables override it)")
    p.add_argument("--workers", type=int, help="worker threads (default: the settings' 'workers', else 2; 0 = intake only)")
    p.set_defaults(handler=serve)


def serve(args: argparse.Namespace) -> int:
    import logging

    import uvicorn

    from bot.app import create_app
    from bot.queue import SqliteJobStore, StoreError
    from bot.server import uvicorn_config
    from bot.settings import SettingsError, load_settings
    from bot.worker import Service

    try:
        settings = load_settings(args.settings)
        if args.db:
            settings.db = args.db
        if args.workers is not None:
            settings.workers = args.workers
        settings.require_app()
        store = SqliteJobStore(settings.db)
    except (SettingsError, StoreError) as exc:
        print(f"drift-audit serve: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("drift_audit").info("settings: %s", settings.redacted())
    from bot.payloads import warm

    threading.Thread(target=warm, daemon=True, name="schemas").start()  # compiled before deliveries need them
    service = Service(settings, store)
    service.start()
    try:
        uvicorn.Server(uvicorn_config(create_app(settings, store, service), settings, args.host, args.port)).run()
    finally:
        service.stop()
    return 0
