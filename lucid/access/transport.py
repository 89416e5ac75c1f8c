"""How `lucid serve` meets the network: TLS (`--ssl-certfile`, `--ssl-keyfile`) and the reverse proxies
whose client-address header it believes (`--forwarded-allow-ips`).

TLS: the certificate and key are loaded here, with Python's ssl module, before the server listens, so
a missing or unreadable file, a key without a certificate (or the reverse) and a key that does not
match its certificate are one line at start, not a traceback in every worker. The context is the
ssl module's server default (TLS 1.2 or later, its cipher selection), not uvicorn's ("TLSv1"
ciphers). The handshake's deadline is set where the connections are (lucid/access/protocol.py,
`tls_protocol`).

Behind a reverse proxy every connection comes from the proxy's address, so per-client caps, rates
and the address-keyed ledger would lump every client together. The proxy names the client in
X-Forwarded-For; anyone can write that header, so it is read only on a connection whose TCP peer is
one of `--forwarded-allow-ips`, and then only its last entry that is not itself a trusted proxy (each
proxy appends the address it saw; entries further left were written by the client). uvicorn's own
version of this (`proxy_headers`, on by default for 127.0.0.1 and the FORWARDED_ALLOW_IPS variable)
is turned off: one rule, in one place, and nothing an environment variable changes unnoticed.
"""

from __future__ import annotations

import ipaddress
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from lucid.access.limits import client_group
from lucid.errors import LucidError

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_forwarded_allow_ips(text: str) -> tuple[str, ...]:
    """`--forwarded-allow-ips 127.0.0.1,10.0.0.0/8,::1` -> its entries, each an IP address or network;
    one line for anything else ("*" included: trusting every peer lets any client name any address)."""
    entries = tuple(e.strip() for e in text.split(","))
    if not entries or not all(entries):
        raise LucidError("--forwarded-allow-ips must be a comma-separated list of IP addresses or networks")
    for entry in entries:
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise LucidError(
                f"--forwarded-allow-ips: {entry!r} is not an IP address or network (e.g. 127.0.0.1, 10.0.0.0/8, ::1)"
            ) from None
    return entries


@dataclass(frozen=True)
class ServeTransport:
    """TLS files and trusted proxies of `lucid serve` (module docstring). `forwarded_allow_ips`: IP
    addresses or networks; empty: X-Forwarded-For is never read."""

    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    forwarded_allow_ips: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            given, missing = (
                ("--ssl-certfile", "--ssl-keyfile") if self.ssl_keyfile is None else ("--ssl-keyfile", "--ssl-certfile")
            )
            raise LucidError(f"{given} needs {missing}: TLS takes a certificate and its private key")
        networks: list[_Network] = []
        for entry in self.forwarded_allow_ips:
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                raise LucidError(f"--forwarded-allow-ips: {entry!r} is not an IP address or network") from None
        object.__setattr__(self, "_networks", tuple(networks))

    @property
    def tls(self) -> bool:
        return self.ssl_certfile is not None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server's TLS context (None without TLS), or one line naming what is wrong."""
        if self.ssl_certfile is None or self.ssl_keyfile is None:
            return None
        for option, path in (("--ssl-certfile", self.ssl_certfile), ("--ssl-keyfile", self.ssl_keyfile)):
            try:
                with open(path, "rb") as f:
                    f.read(1)
            except OSError as exc:
                raise LucidError(f"{option}: cannot read {path}: {exc.strerror or exc}") from None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
        except ssl.SSLError as exc:
            reason = (exc.reason or str(exc)).lower().replace("_", " ")
            if "mismatch" in reason:
                raise LucidError(
                    f"--ssl-keyfile {self.ssl_keyfile} is not the key of the certificate {self.ssl_certfile}"
                ) from None
            raise LucidError(
                f"cannot load the certificate {self.ssl_certfile} with the key {self.ssl_keyfile}: "
                f"{reason} (both must be PEM files, the key unencrypted)"
            ) from None
        return context

    def trusts(self, peer: str | None) -> bool:
        """Whether `peer` (a TCP peer's address) is a trusted proxy."""
        if not peer or not self._networks:  # type: ignore[attr-defined]
            return False
        try:
            address = ipaddress.ip_address(peer.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in network for network in self._networks)  # type: ignore[attr-defined]

    def client_address(self, peer: str | None, forwarded_for: Iterable[bytes]) -> str | None:
        """The address a request is counted under (lucid.access.limits.client_group): the peer's, or,
        from a trusted proxy, the last X-Forwarded-For entry that is no trusted proxy. A trusted
        proxy's request without a usable entry counts under the proxy's own address."""
        if self.trusts(peer):
            entries = [e.strip() for value in forwarded_for for e in value.decode("latin-1").split(",")]
            for entry in reversed(entries):
                host = (
                    entry[1 : entry.find("]")]
                    if entry.startswith("[")
                    else (entry.rsplit(":", 1)[0] if entry.count(":") == 1 else entry)
                )
                if self.trusts(host):
                    continue
                group = client_group(host)
                if group is not None:
                    return group
                break  # not an address: the proxy's own
        return client_group(peer)
