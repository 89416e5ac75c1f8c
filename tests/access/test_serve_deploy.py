"""docs/deploy.md's nginx configuration, run: nginx terminates TLS in front of `lucid serve` on
loopback, and the service counts each real client (X-Forwarded-For from its trusted proxy only).
Skipped where nginx or trustme is not installed (`apt-get install nginx`)."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from serve_helpers import free_port, port_of, request, server, stop, to_orig, until_closed

ROOT = Path(__file__).resolve().parents[2]
NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).exists()),
                                       None)
pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed")


def documented_nginx_block() -> str:
    """The ```nginx block of docs/deploy.md."""
    found = re.search(r"```nginx\n(.*?)```", (ROOT / "docs" / "deploy.md").read_text(), re.S)
    assert found, "docs/deploy.md has no nginx block"
    return found.group(1)


@contextlib.contextmanager
def nginx(tmp: Path, upstream_port: int, cert: Path, key: Path, replace: tuple[tuple[str, str], ...] = ()):
    """nginx with docs/deploy.md's block (its names, paths and ports replaced, and `replace`) on a free
    port; yields the port."""
    port = free_port()
    block = documented_nginx_block()
    for old, new in [*replace, ("127.0.0.1:8000", f"127.0.0.1:{upstream_port}"), ("listen 443 ssl", f"listen 127.0.0.1:{port} ssl"),
                     ("/etc/lucid/tls/fullchain.pem", str(cert)), ("/etc/lucid/tls/privkey.pem", str(key)),
                     ("api.example.com", "localhost")]:
        assert old in block, old
        block = block.replace(old, new)
    (tmp / "lucid.conf").write_text(block)
    temp = {name: tmp / name for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi")}
    conf = tmp / "nginx.conf"
    conf.write_text(
        f"daemon off;\nworker_processes 1;\npid {tmp / 'nginx.pid'};\nerror_log {tmp / 'error.log'} warn;\n"
        "worker_rlimit_nofile 8192;\nevents { worker_connections 4096; }\n"
        "http {\n access_log off;\n"
        f" client_body_temp_path {temp['body']};\n proxy_temp_path {temp['proxy']};\n"
        f" fastcgi_temp_path {temp['fastcgi']};\n uwsgi_temp_path {temp['uwsgi']};\n scgi_temp_path {temp['scgi']};\n"
        f" include {tmp / 'lucid.conf'};\n}}\n")
    proc = subprocess.Popen([NGINX, "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "error.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"nginx ended: {proc.stderr.read()}{(tmp / 'error.log').read_text()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "nginx did not start"
                time.sleep(0.1)
        yield port
    finally:
        stop(proc)


def test_the_documented_nginx_deployment(run_dir, tmp_path):
    """HTTPS through nginx reaches the service; --rate counts each real client behind the proxy
    (measured before: every client had the proxy's address), whatever X-Forwarded-For a client writes."""
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    issued = ca.issue_cert("localhost", "127.0.0.1")
    cert, key, ca_file = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    issued.cert_chain_pems[0].write_to_path(cert)
    issued.private_key_pem.write_to_path(key)
    ca.cert_pem.write_to_path(ca_file)
    context = ssl.create_default_context(cafile=str(ca_file))
    args = ["-e", "1", "--budget", "10", "--memo", str(tmp_path / "m.sqlite"), "--forwarded-allow-ips", "127.0.0.1",
            "--allowed-hosts", "localhost,127.0.0.1", "--rate", "0.01"]
    rows = iter(range(1, 100))

    def post(port: int, source: str, extra: bytes = b"") -> bytes:
        raw = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))
        tls = context.wrap_socket(raw, server_hostname="localhost")
        body = json.dumps({"inputs": to_orig([[next(rows) / 100, 0.5]])}).encode()
        tls.sendall(request("", body, extra + b"connection: close\r\n"))
        return until_closed(tls, limit=30)

    (tmp_path / "nginx").mkdir()
    with server(run_dir, *args) as url, nginx(tmp_path / "nginx", port_of(url), cert, key) as port:
        first = post(port, "127.0.0.3")
        assert first.startswith(b"HTTP/1.1 200") and b'"labels":["' in first, first
        again = post(port, "127.0.0.3", b"x-forwarded-for: 198.51.100.9\r\n")  # nginx replaces the header
        assert again.startswith(b"HTTP/1.1 429") and b"retry-after: 100" in again.lower(), again
        assert post(port, "127.0.0.4").startswith(b"HTTP/1.1 200")  # another client behind the same proxy
        health = context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=30),
                                     server_hostname="localhost")
        health.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nconnection: close\r\n\r\n")
        assert until_closed(health, limit=30).startswith(b"HTTP/1.1 200")
