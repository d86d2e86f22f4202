"""The job log: one line per event on stderr, flushed at once (stdout carries the metrics lines)."""

from __future__ import annotations

import sys


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
