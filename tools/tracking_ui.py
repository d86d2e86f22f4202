"""`make tracking-ui`: MLflow's own web UI over a local run's store, after the address of each experiment's runs.

MLflow 3's UI opens on its GenAI overview; a training run's metrics by step, parameters and verdict are on its
experiment's Runs page, `#/experiments/<id>/runs` (tests/training/test_tracking_ui.py opens that page in a browser).
Run by .venv-tracking's Python (MLflow's server), so nothing here imports the platform.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def runs_pages(store: str, address: str) -> list[str]:
    """One line per experiment holding a run: the address of its Runs page and the experiment's name."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store)
    return [
        f"{address}/#/experiments/{e.experiment_id}/runs  (experiment {e.name!r})"
        for e in client.search_experiments()
        if client.search_runs([e.experiment_id], max_results=1)
    ]


def command(store: str, port: int) -> list[str]:
    """MLflow's server beside this interpreter (the same virtual environment), over the store."""
    return [str(Path(sys.executable).with_name("mlflow")), "ui", "--backend-store-uri", store, "--port", str(port)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True, help="the tracking store, e.g. sqlite:///<abs path>/mlflow.db")
    parser.add_argument("--port", type=int, default=5000)
    args = parser.parse_args(argv)
    pages = runs_pages(args.store, f"http://localhost:{args.port}")
    print(
        "tracking-ui: the runs, once the server below says it listens:", *pages or ["(no run tracked yet)"], sep="\n  "
    )
    sys.stdout.flush()
    argv_ui = command(args.store, args.port)
    os.execv(argv_ui[0], argv_ui)  # the server in this process: make's Ctrl-C stops it
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
