"""The shape every config-driven entry point in ``pipelines/`` shares: ``--config`` YAML plus
``key=value`` overrides, typed and validated before any work; a bad setting or input is one
line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import Any


def config_main(
    doc: str | None,
    config_cls: type,
    run: Callable[[Any], str],
    argv: list[str] | None = None,
    *,
    config_help: str,
    overrides_example: str,
) -> int:
    """Parse ``argv``, load and validate ``config_cls``, call ``run(cfg)`` and print the text it
    returns. ``ValueError`` from loading is a config error; from ``run`` it is a setting or an
    input that cannot work, found before the job does its work (both exit 2)."""
    from infra.config import load_config

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help=config_help)
    parser.add_argument("overrides", nargs="*", help=f"key=value settings, e.g. {overrides_example}")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        cfg = load_config(config_cls, args.config, args.overrides)
        cfg.validate()
    except ValueError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    try:
        text = run(cfg)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(text)
    return 0
