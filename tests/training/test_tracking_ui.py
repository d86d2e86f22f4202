"""`make tracking-ui`: MLflow's own server and web UI (.venv-tracking, requirements-tracking.txt) over a store the
platform's tracker wrote, as after `make local-run`: the page is served, the API it reads lists the run with its
metrics, and in a real headless browser (Chromium through Selenium, where installed) the page shows the run. The same
server stands in for a SageMaker managed one, reached by its ARN through the sagemaker-mlflow plugin."""

import contextlib
import http.server
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from efa_training.runtime import tracking
from tools import tracking_ui

ROOT = Path(__file__).resolve().parents[2]
MLFLOW = ROOT / ".venv-tracking" / "bin" / "mlflow"
RUN = "ui-001"

pytestmark = [
    pytest.mark.slow,  # a real server process
    pytest.mark.skipif(not MLFLOW.exists(), reason="make setup creates .venv-tracking (MLflow's server and UI)"),
]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """A store holding one tracked run (the launcher's tracker wrote it)."""
    store = f"sqlite:///{tmp_path_factory.mktemp('ui') / 'mlflow.db'}"
    tracker = tracking.Tracker(store, "local", RUN, {"model": "tiny", "workload": "gpt"})
    for step in (1, 2, 3):
        tracker.add(step, {"Loss": 3.0 - step / 2})
    tracker.close()
    return store


@pytest.fixture(scope="module")
def ui(store) -> Iterator[str]:
    """The UI's address, over the store."""
    port = _port()
    # The command tools/tracking_ui.py runs for `make tracking-ui` (by .venv-tracking's mlflow), on a free port.
    server = subprocess.Popen(
        [str(MLFLOW), *tracking_ui.command(store, port)[1:], "--host", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    address = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):  # the server's first start migrates nothing (the tracker did) but imports a lot
            try:
                urllib.request.urlopen(f"{address}/health", timeout=1)
                break
            except OSError:
                assert server.poll() is None, "mlflow ui exited"
                time.sleep(0.5)
        yield address
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_make_target_opens_the_local_runs_store():
    makefile = (ROOT / "Makefile").read_text()
    tool = "$(TRACKING_VENV)/bin/python -m tools.tracking_ui --store sqlite:///$(CURDIR)/local-run/mlflow.db"
    assert tool in makefile
    # The tool runs the mlflow beside the Python that runs it: .venv-tracking's, which has MLflow's server.
    beside = str(Path(sys.executable).with_name("mlflow"))
    assert tracking_ui.command("sqlite:///x.db", 5000) == [
        beside,
        "ui",
        "--backend-store-uri",
        "sqlite:///x.db",
        "--port",
        "5000",
    ]


def test_it_prints_the_runs_page_of_each_experiment_holding_a_run(store, ui):
    # MLflow 3 opens on its GenAI overview; the page printed is the one the browser test finds the run on.
    (page,) = tracking_ui.runs_pages(store, ui)
    assert page == f"{ui}/#/experiments/1/runs  (experiment 'local')"


def test_the_ui_is_served_and_its_api_lists_the_run_with_its_metrics(ui):
    page = urllib.request.urlopen(f"{ui}/", timeout=10).read().decode()
    assert "<html" in page.lower() and "static-files" in page  # MLflow's single-page app
    request = urllib.request.Request(
        f"{ui}/api/2.0/mlflow/runs/search",
        data=json.dumps({"experiment_ids": ["1"], "filter": f"attributes.run_name = '{RUN}'"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    (run,) = json.loads(urllib.request.urlopen(request, timeout=10).read())["runs"]
    assert {m["key"]: m["value"] for m in run["data"]["metrics"]} == {"Loss": 1.5}  # the last step's value
    assert {p["key"]: p["value"] for p in run["data"]["params"]}["workload"] == "gpt"


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None or shutil.which("chromedriver") is None, reason="no Chromium and chromedriver")
def test_a_headless_browser_shows_the_run_in_the_experiments_page(ui):
    from selenium import webdriver
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = _chromium() or ""
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    browser = webdriver.Chrome(options=options, service=service)
    try:
        browser.get(f"{ui}/#/experiments/1/runs")  # the training runs (MLflow 3 opens on its GenAI overview)
        # The page is rendered by the app's JavaScript from the API above: the run's name appears once it has run.
        WebDriverWait(browser, 60).until(lambda b: RUN in b.find_element("tag name", "body").text)
        assert "local" in browser.find_element("tag name", "body").text  # the experiment: the environment's name
    finally:
        browser.quit()


ARN = "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/efa-training-dev"


@contextlib.contextmanager
def _recording_proxy(upstream: str, seen: list[tuple[str, str]]) -> Iterator[str]:
    """An HTTP server in front of `upstream` that records each request's path and Authorization header."""

    class Forward(http.server.BaseHTTPRequestHandler):
        def _forward(self) -> None:
            seen.append((self.path, self.headers.get("Authorization", "")))
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
            request = urllib.request.Request(f"{upstream}{self.path}", data=body, method=self.command)
            request.add_header("Content-Type", "application/json")
            try:
                with urllib.request.urlopen(request, timeout=30) as answer:
                    status, payload = answer.status, answer.read()
            except urllib.error.HTTPError as error:
                status, payload = error.code, error.read()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PATCH = do_DELETE = _forward

        def log_message(self, *args) -> None:  # quiet
            pass

    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{proxy.server_address[1]}"
    finally:
        proxy.shutdown()


def test_a_managed_servers_arn_is_reached_with_requests_signed_by_the_jobs_role(ui, monkeypatch):
    # A job's environment on a SageMaker managed server (constructs/storage/tracking.py): MLFLOW_TRACKING_URI is the
    # server's ARN; the sagemaker-mlflow plugin resolves it (SAGEMAKER_MLFLOW_CUSTOM_ENDPOINT, the plugin's own
    # override, points it here instead of https://us-east-1.experiments.sagemaker.aws) and signs with the role's keys.
    seen: list[tuple[str, str]] = []
    with _recording_proxy(ui, seen) as endpoint:
        job = {"MLFLOW_TRACKING_URI": ARN, "SAGEMAKER_MLFLOW_CUSTOM_ENDPOINT": endpoint,
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "AKIAJOBROLEEXAMPLE",
               "AWS_SECRET_ACCESS_KEY": "example", "TRAINING_ENVIRONMENT": "local",
               "MODELS_PREFIX": "s3://data-bucket/models/"}  # fmt: skip
        for name, value in job.items():
            monkeypatch.setenv(name, value)
        tracker = tracking.Tracker.from_env(job, "managed-001", {"workload": "gpt"})
        assert tracker is not None
        tracker.add(1, {"Loss": 2.0})
        tracker.close()
        tracking.record_verdict(job, "managed-001", {"metric": "val_loss", "value": 1.9, "passed": True, "step": 1})
    # Every request carried a SigV4 signature for the sagemaker-mlflow service (the IAM actions' prefix), no password.
    scope = "Credential=AKIAJOBROLEEXAMPLE/"
    assert len(seen) >= 5 and all(auth.startswith("AWS4-HMAC-SHA256 ") and scope in auth for _, auth in seen), seen
    assert all("/us-east-1/sagemaker-mlflow/aws4_request" in auth for _, auth in seen)
    assert any("/model-versions/create" in path for path, _ in seen)  # the approved model, through the registry API
    request = urllib.request.Request(
        f"{ui}/api/2.0/mlflow/runs/search",
        data=json.dumps({"experiment_ids": ["1"], "filter": "attributes.run_name = 'managed-001'"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    (run,) = json.loads(urllib.request.urlopen(request, timeout=10).read())["runs"]
    assert {m["key"] for m in run["data"]["metrics"]} >= {"Loss", "verdict_value", "verdict_passed"}
