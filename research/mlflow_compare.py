"""Screenshot the MLflow UI's side-by-side comparison of loops (parent runs), with headless Chromium.

    python -m research.mlflow_compare --runs loop v3-judge-majority_vote --out reports/mlflow_compare.png

Starts an MLflow server on the store (default: the repo's mlflow.db) on a free local port, opens
the run-comparison page of the named parent runs, saves a screenshot, and checks that the page
really rendered those runs (their names in the DOM). Exits non-zero, naming what is missing,
when a run is not in the store or the page did not render.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, seconds: float) -> None:
    """Until `url` answers 200; SystemExit if `proc` (its server) dies or time runs out."""
    deadline = time.time() + seconds
    while True:
        try:
            if urllib.request.urlopen(url, timeout=5).status == 200:
                return
        except OSError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"the server for {url} exited with {proc.returncode}")
        if time.time() > deadline:
            raise SystemExit(f"{url} did not answer within {seconds:.0f} s")
        time.sleep(1)


def parent_runs(uri: str, experiment: str, names: list[str]) -> tuple[str, list[str]]:
    """The experiment id and the latest parent run id of each name, in order."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise SystemExit(f"mlflow_compare: no experiment {experiment!r} in {uri}")
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"])
    by_name: dict[str, str] = {}
    for r in runs:
        if "mlflow.parentRunId" not in r.data.tags:
            by_name.setdefault(r.info.run_name, r.info.run_id)
    missing = [n for n in names if n not in by_name]
    if missing:
        raise SystemExit(f"mlflow_compare: no parent run named {missing} in experiment {experiment!r} "
                         f"(found {sorted(by_name)})")
    return exp.experiment_id, [by_name[n] for n in names]


def browse(browser: str, url: str, *extra: str) -> str:
    """Headless Chromium on `url` (with e.g. --dump-dom or --screenshot=PATH); its stdout."""
    cmd = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--hide-scrollbars", "--window-size=1600,1100", "--virtual-time-budget=25000", *extra, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180).stdout


def screenshot(uri: str, experiment: str, names: list[str], out: Path) -> str:
    browser = chromium()
    if browser is None:
        raise SystemExit("mlflow_compare: headless Chromium not found (apt-get install chromium)")
    exp_id, run_ids = parent_runs(uri, experiment, names)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/health", server, 180)
        query = urllib.parse.urlencode({"runs": json.dumps(run_ids), "experiments": json.dumps([exp_id])})
        url = f"{base}/#/compare-runs?{query}"
        dom = browse(browser, url, "--dump-dom")
        missing = [n for n in names if n not in dom]
        if missing:
            raise SystemExit(f"mlflow_compare: the comparison page did not show {missing}")
        out.parent.mkdir(parents=True, exist_ok=True)
        browse(browser, url, f"--screenshot={out.resolve()}")
        if not out.is_file() or out.stat().st_size < 10_000:
            raise SystemExit(f"mlflow_compare: no screenshot written to {out}")
        return dom
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m research.mlflow_compare", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", nargs="+", required=True, help="parent run names (DVC experiment names, or `loop`)")
    p.add_argument("--experiment", default="self-improve", help="MLflow experiment (tracking.experiment)")
    p.add_argument("--uri", default=f"sqlite:///{ROOT / 'mlflow.db'}", help="MLflow tracking store")
    p.add_argument("--out", default="reports/mlflow_compare.png", help="PNG to write")
    args = p.parse_args(argv)
    screenshot(args.uri, args.experiment, args.runs, Path(args.out))
    print(f"screenshot of {args.runs} written to {args.out}")


if __name__ == "__main__":
    main()
