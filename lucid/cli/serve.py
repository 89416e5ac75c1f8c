"""`lucid serve RUN --epsilon E`: label-only, iDP-protected predictions over HTTP."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import click

from lucid.access.memo import DEFAULT_MEMO_SIZE
from lucid.access.server import DEFAULT_MAX_BATCH, DEFAULT_MAX_BODY
from lucid.errors import LucidError


def _check_port_free(host: str, port: int) -> None:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise LucidError(f"cannot resolve host {host!r}: {exc}") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise LucidError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


@click.command(name="serve")
@click.argument("run", type=click.Path(path_type=Path))
@click.option("--epsilon", "-e", type=float, required=True, help="Privacy budget of the exponential mechanism.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind (loopback by default).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--memo", type=click.Path(path_type=Path), default=None,
              help="SQLite memo of noised answers [default: RUN/memo.sqlite]. Keep it: deleting it lets "
                   "clients re-sample noisy labels.")
@click.option("--memo-size", default=DEFAULT_MEMO_SIZE, show_default=True, type=click.IntRange(min=1),
              help="Most inputs the memo keeps (least recently used are evicted).")
@click.option("--clip", is_flag=True, help="Clip inputs outside the verified domain into it instead of refusing them.")
@click.option("--api-key-env", metavar="VAR", default=None,
              help="Require 'Authorization: Bearer <token>' with the token read from this environment variable.")
@click.option("--max-batch", default=DEFAULT_MAX_BATCH, show_default=True, type=click.IntRange(min=1),
              help="Most inputs per request.")
@click.option("--max-body", default=DEFAULT_MAX_BODY, show_default=True, type=click.IntRange(min=1),
              help="Largest request body in bytes.")
def command(run: Path, epsilon: float, host: str, port: int, memo: Path | None, memo_size: int, clip: bool,
            api_key_env: str | None, max_batch: int, max_body: int) -> None:
    """Serve RUN's classifier: POST /v1/predict {"inputs": [[...]]} -> {"labels": [...]}."""
    import uvicorn

    from lucid.access.classifier import LabelOnlyClassifier
    from lucid.access.server import create_app

    api_key = None
    if api_key_env is not None:
        api_key = os.environ.get(api_key_env, "")
        if not api_key:
            raise LucidError(f"--api-key-env: the environment variable {api_key_env} is not set or empty")
    if not run.is_dir():
        raise LucidError(f"run directory {run} does not exist")
    memo_path = memo if memo is not None else run / "memo.sqlite"
    clf = LabelOnlyClassifier.from_run(run, epsilon=epsilon, memo=memo_path, clip=clip, memo_size=memo_size)
    _check_port_free(host, port)
    app = create_app(clf, api_key=api_key, max_body=max_body, max_batch=max_batch)
    click.echo(
        f"lucid: serving {run} on http://{host}:{port}/v1/predict (epsilon={clf.epsilon:g}, memo={memo_path}"
        f"{', auth on' if api_key else ''}{', clipping' if clip else ''}); Ctrl-C stops",
        err=True,
    )
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False, server_header=False)
    finally:
        clf.close()
