"""Team servers that let in only the team: `make mlflow-server` and `make prefect-server`.

    python -m self_improve.team mlflow --host 0.0.0.0 --port 5000      # what make mlflow-server runs
    python -m self_improve.team prefect --host 0.0.0.0 --port 4200     # what make prefect-server runs

Bound to loopback (127.0.0.1, ::1, localhost), each starts open to this machine's users, as before.
Bound beyond it (any other host, 0.0.0.0 included), or with `--auth`, each asks who is calling, and
refuses to start, naming what is missing, until it can:

- MLflow runs its basic-auth app (`mlflow server --app-name basic-auth`, the `mlflow[auth]` extra):
  users and permissions in their own store (`--auth-db`), the admin's password from
  MLFLOW_AUTH_ADMIN_PASSWORD (never MLflow's old default `password1234`) and a secret key for its
  CSRF protection from MLFLOW_FLASK_SERVER_SECRET_KEY. A new user reads every experiment and edits
  none (`--default-permission READ`) until the admin grants more (docs/operations.md). Loops log with
  MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD from their environment (MLflow reads them).
- Prefect's server takes PREFECT_SERVER_API_AUTH_STRING (`user:password`); every client, worker and
  `make serve` / `make deploy` sends PREFECT_API_AUTH_STRING, the same string (Prefect reads both);
  the UI asks for it on first load.

Secrets come from the environment only: no argument carries one (a process list shows arguments).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
import tempfile
from pathlib import Path

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}
OLD_DEFAULT_PASSWORD = "password1234"  # MLflow's basic-auth default before 3.x: what scanners try first
PERMISSIONS = ("READ", "EDIT", "MANAGE", "NO_PERMISSIONS")


class Refused(SystemExit):
    """A server that would let anyone in: what is missing, and where it goes."""


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: reachable from elsewhere, as far as this can tell


def _need(env: dict, name: str, what: str) -> str:
    value = env.get(name, "")
    if not value.strip():
        raise Refused(f"error: {name} is not set: {what}")
    return value


def mlflow_command(host: str, port: int, backend: str, artifacts: str, auth: bool, auth_db: str,
                   default_permission: str = "READ", env: dict | None = None,
                   config_dir: Path | None = None) -> tuple[list[str], dict]:
    """The `mlflow server` command and its environment; beyond loopback (or `auth`), the basic-auth app
    with its config written (0600) where MLflow reads it (MLFLOW_AUTH_CONFIG_PATH)."""
    env = dict(os.environ if env is None else env)
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend,
           "--artifacts-destination", artifacts, "--serve-artifacts", "--host", host, "--port", str(port)]
    if not (auth or not is_loopback(host)):
        return cmd, env
    if default_permission not in PERMISSIONS:
        raise Refused(f"error: --default-permission: one of {', '.join(PERMISSIONS)} (got {default_permission!r})")
    password = _need(env, "MLFLOW_AUTH_ADMIN_PASSWORD", f"the admin's password of the MLflow server on {host}")
    if password == OLD_DEFAULT_PASSWORD:
        raise Refused("error: MLFLOW_AUTH_ADMIN_PASSWORD is MLflow's old default password; choose another")
    _need(env, "MLFLOW_FLASK_SERVER_SECRET_KEY", "a long random secret for the server's CSRF protection "
          "(python -c 'import secrets; print(secrets.token_hex(32))')")
    try:
        import flask_wtf  # noqa: F401 - what mlflow[auth] adds
    except ImportError:
        raise Refused("error: the MLflow basic-auth app needs mlflow[auth] (make install)") from None
    folder = Path(config_dir or tempfile.mkdtemp(prefix="mlflow-auth-"))
    folder.mkdir(parents=True, exist_ok=True)
    ini = folder / "basic_auth.ini"
    fd = os.open(ini, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:  # no password in it: MLflow takes it from the environment
        f.write(f"[mlflow]\ndefault_permission = {default_permission}\ndatabase_uri = {auth_db}\n"
                f"admin_username = {env.get('MLFLOW_AUTH_ADMIN_USERNAME') or 'admin'}\n"
                "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
    env["MLFLOW_AUTH_CONFIG_PATH"] = str(ini)
    return cmd + ["--app-name", "basic-auth"], env


def prefect_command(host: str, port: int, auth: bool, env: dict | None = None) -> tuple[list[str], dict]:
    """The `prefect server start` command and its environment; beyond loopback (or `auth`), only with
    PREFECT_SERVER_API_AUTH_STRING set. Its telemetry is off (no one to send it to offline)."""
    env = dict(os.environ if env is None else env)
    env.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if auth or not is_loopback(host):
        value = _need(env, "PREFECT_SERVER_API_AUTH_STRING", f"the credentials (user:password) every client of the "
                      f"Prefect server on {host} sends as PREFECT_API_AUTH_STRING")
        if ":" not in value:
            raise Refused("error: PREFECT_SERVER_API_AUTH_STRING: expected user:password")
    return [sys.executable, "-m", "prefect", "server", "start", "--host", host, "--port", str(port)], env


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m self_improve.team", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="server", required=True)
    m = sub.add_parser("mlflow", help="the MLflow tracking server (make mlflow-server)")
    m.add_argument("--host", default="127.0.0.1")
    m.add_argument("--port", type=int, default=5000)
    m.add_argument("--backend", default=f"sqlite:///{Path('mlflow-server.db').resolve()}")
    m.add_argument("--artifacts", default=str(Path("mlartifacts").resolve()))
    m.add_argument("--auth-db", default=f"sqlite:///{Path('mlflow-auth.db').resolve()}",
                   help="the basic-auth app's users and permissions")
    m.add_argument("--default-permission", default="READ", help="what a new user may do until granted more")
    m.add_argument("--auth", action="store_true", help="ask who is calling on loopback too")
    p = sub.add_parser("prefect", help="the Prefect API and UI (make prefect-server)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=4200)
    p.add_argument("--auth", action="store_true", help="ask for the auth string on loopback too")
    args = ap.parse_args(argv)
    if args.server == "mlflow":
        cmd, env = mlflow_command(args.host, args.port, args.backend, args.artifacts, args.auth, args.auth_db,
                                  args.default_permission)
        asks = cmd[-1] == "basic-auth"
    else:
        cmd, env = prefect_command(args.host, args.port, args.auth)
        asks = bool(env.get("PREFECT_SERVER_API_AUTH_STRING", "").strip())  # Prefect enforces it whenever set
    print(f"{args.server} on {args.host}:{args.port}: {'asks who is calling' if asks else 'open to this machine'}",
          flush=True)
    os.execvpe(cmd[0], cmd, env)


if __name__ == "__main__":
    main()
