"""Where an endpoint benchmark may connect: the node resolves the endpoint's host, checks every address it resolves
to, and the client then connects to those addresses only (pinned: the host is never resolved again, so a DNS answer
that changes between the check and the connection, DNS rebinding, reaches nothing new).

The rule. Ordinary unicast addresses, public or private, are allowed: private ranges (10/8, 172.16/12,
192.168/16, 100.64/10, fc00::/7) are where a cluster's endpoints live. Refused unless the operator lists them in
``D0_NODE_ENDPOINT_ALLOW`` (``python -m workers.node --endpoint-allow``): loopback, link-local, unspecified ("this
network", 0/8 and ::), multicast, reserved and broadcast addresses, and the cloud metadata services (by name, and
by address, which only a listing of that one address allows: 169.254.0.0/16 listed for a link-local endpoint does
not open 169.254.169.254). The node's own broker (its host's addresses at its port) is refused whatever is
listed: it is never an endpoint, and loopback listed for a local endpoint must not open the embedded broker beside
it. An IPv4 address however it is written (0x7f000001, 2130706433, 0177.0.0.1) is what the system resolver makes of
it, and an IPv6 address carrying an IPv4 one (::ffff:127.0.0.1, 6to4, NAT64) is checked as that IPv4 address too.
Every address the host resolves to is checked: one refused refuses the endpoint.

The allow-list: hosts or CIDRs separated by commas or spaces. A CIDR (or a single address) allows the addresses in
it whatever their kind; a host name allows that name, as the endpoint's URL writes it, whatever it resolves to.
Plain Python (no Django): the node and ``python -m workers.engine bench-endpoint`` use it.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

ALLOW_ENV = "D0_NODE_ENDPOINT_ALLOW"
# Set by the node from its --broker (host:port pairs, ';'-separated), never by hand: the stage process knows its
# broker only from what the node tells it.
BROKER_ENV = "D0_NODE_BROKER_ADDRESSES"

# Names the clouds' instance metadata services answer at (from inside an instance). Refused by name, before any
# lookup: off the cloud they do not resolve, and on it a rebinding answer must not matter.
METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata.goog", "metadata", "instance-data",
                            "instance-data.ec2.internal"})
# The services' addresses, where they are not link-local already: AWS's IPv6 one is a private (fd00::/8)
# address, Alibaba's a shared-space (100.64/10) one, Oracle's legacy one in 192.0.0/24.
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(text) for text in (
    "169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200", "192.0.0.192"))
THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")
NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
DEFAULT_PORTS = {"http": 80, "https": 443, "redis": 6379, "rediss": 6379, "sentinel": 26379, "amqp": 5672,
                 "amqps": 5671, "pyamqp": 5672, "valkey": 6379, "valkeys": 6379}
HOST_NAME = re.compile(r"^[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*$")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class EndpointNotAllowed(ValueError):
    """The endpoint's host is, or resolves to, an address this node may not reach."""


def _name(host: str) -> str:
    return host.strip().lower().rstrip(".")


def _ipv4_inside(address: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, NAT64), which is what a connection to it reaches."""
    if address.version == 4:
        return None
    if address.ipv4_mapped:
        return address.ipv4_mapped
    if address.sixtofour:
        return address.sixtofour
    if any(address in network for network in NAT64):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _parse_address(text: str) -> Address:
    return ipaddress.ip_address(text.split("%", 1)[0])  # a scoped fe80::1%eth0 is fe80::1, link-local


def metadata_host(host: str) -> bool:
    """Whether a URL's host is a cloud metadata service by its name or its address however written, without a
    lookup: the control plane's check when an endpoint is saved (it cannot know a node's DNS)."""
    host = _name(host or "").strip("[]")
    if host in METADATA_HOSTS:
        return True
    try:
        address = _parse_address(host)
    except ValueError:
        try:
            address = ipaddress.IPv4Address(socket.inet_aton(host))  # 0xa9fea9fe, 2852039166, 0251.0376.…
        except OSError:
            return False
    return any(candidate in METADATA_ADDRESSES for candidate in (address, _ipv4_inside(address)))


def why_refused(address: Address) -> str | None:
    """What kind of address this is, when it is a kind refused unless listed; None for an ordinary one. An IPv6
    address carrying an IPv4 one is judged as that IPv4 address (::ffff:127.0.0.1 is loopback, ::ffff:8.8.8.8 is
    not reserved)."""
    address = _ipv4_inside(address) or address
    if address in METADATA_ADDRESSES:
        return "a cloud metadata service's address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_unspecified or (address.version == 4 and address in THIS_NETWORK):
        return "an unspecified address"
    if address.is_multicast:
        return "a multicast address"
    if address.is_reserved or address == ipaddress.IPv4Address("255.255.255.255"):
        return "a reserved address"
    return None


@dataclass(frozen=True)
class AllowList:
    """What the operator listed: networks (a single address is a /32 or /128) and host names."""

    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    hosts: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, text: str) -> AllowList:
        networks, hosts = [], set()
        for entry in re.split(r"[\s,]+", text or ""):
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
            name = _name(entry)
            if not HOST_NAME.match(name):
                raise ValueError(f"{entry!r} is neither a host name nor an address or CIDR (e.g. 10.0.0.0/8)")
            hosts.add(name)
        return cls(tuple(networks), frozenset(hosts))

    def allows_host(self, host: str) -> bool:
        return _name(host) in self.hosts

    def allows_address(self, address: Address) -> bool:
        inside = _ipv4_inside(address)
        return any(candidate in network for network in self.networks for candidate in (address, inside)
                   if candidate is not None and candidate.version == network.version)

    def lists_exactly(self, address: Address) -> bool:
        """Listed as that one address (a /32 or /128), not inside a wider range: the metadata services' rule."""
        inside = _ipv4_inside(address)
        return any(network.num_addresses == 1 and network.network_address in (address, inside)
                   for network in self.networks)

    def __str__(self) -> str:
        return ", ".join([*map(str, self.networks), *sorted(self.hosts)]) or "nothing"


def broker_addresses(broker_url: str) -> str:
    """The broker's ``host:port`` pairs (``;``-separated, as Celery separates fail-over URLs) for BROKER_ENV."""
    pairs = []
    for url in (broker_url or "").split(";"):
        try:
            parts = urlsplit(url.strip())
            port = parts.port or DEFAULT_PORTS.get(parts.scheme.split("+")[0])
        except ValueError:
            continue
        if parts.hostname and port:
            host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
            pairs.append(f"{host}:{port}")
    return ";".join(pairs)


def node_environment(allow: str, broker_url: str) -> dict[str, str]:
    """What the node puts in its environment for its stages (checked: a bad allow-list stops the node's start)."""
    AllowList.parse(allow)
    return {ALLOW_ENV: allow or "", BROKER_ENV: broker_addresses(broker_url)}


def _resolve(host: str, port: int) -> list[Address]:
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as error:
        raise OSError(f"the endpoint's host {host} does not resolve on this node: {error}") from None
    return list(dict.fromkeys(_parse_address(entry[4][0]) for entry in found))


def _same(one: Address, other: Address) -> bool:
    return one == other or _ipv4_inside(one) == other or one == _ipv4_inside(other)


@dataclass(frozen=True)
class EndpointPolicy:
    allow: AllowList = AllowList()
    broker: tuple[tuple[str, int], ...] = ()  # the node's broker, (host, port) pairs

    @classmethod
    def from_environment(cls, environ=None) -> EndpointPolicy:
        environ = os.environ if environ is None else environ
        broker = []
        for pair in (environ.get(BROKER_ENV) or "").split(";"):
            host, _, port = pair.strip().rpartition(":")
            if host and port.isdigit():
                broker.append((host.strip("[]"), int(port)))
        return cls(AllowList.parse(environ.get(ALLOW_ENV, "")), tuple(broker))

    def _is_broker(self, host: str, address: Address, port: int) -> bool:
        for broker_host, broker_port in self.broker:
            if broker_port != port:
                continue
            if _name(broker_host) == _name(host):
                return True
            try:
                if any(_same(address, known) for known in _resolve(broker_host, broker_port)):
                    return True
            except OSError:
                continue  # a broker this node cannot resolve is one it cannot reach either
        return False

    def pin(self, base_url: str) -> tuple[str, ...]:
        """The addresses the endpoint's host resolves to, every one checked; the client connects to these only.
        Raises EndpointNotAllowed naming the address and why, OSError when the host does not resolve."""
        import yarl  # aiohttp's own URL parser: the host checked is the host the client connects to

        url = yarl.URL(base_url)
        host, port = url.host or "", url.port
        if not host or not port:
            raise EndpointNotAllowed(f"{base_url!r} names no host and port")
        hint = (f"a node reaches it only when its operator lists it (python -m workers.node --endpoint-allow, "
                f"{ALLOW_ENV}; listed here: {self.allow})")
        listed_name = self.allow.allows_host(host)
        if _name(host) in METADATA_HOSTS and not listed_name:
            raise EndpointNotAllowed(f"{host} is a cloud metadata service: refused; {hint}")
        addresses = _resolve(host, port)
        for address in addresses:
            inside = _ipv4_inside(address)
            shown = host if str(address) == host else f"{host} ({address})"
            shown += f" (IPv4 {inside})" if inside else ""
            if self._is_broker(host, address, port):
                # Never an OpenAI endpoint, and a listed loopback (for a local endpoint) must not open the
                # embedded broker next to it: refused whatever the allow-list says.
                raise EndpointNotAllowed(f"the endpoint {shown} port {port} is this node's broker: refused")
            if listed_name:
                continue
            if any(_same(address, known) for known in METADATA_ADDRESSES):
                if self.allow.lists_exactly(address):
                    continue
                raise EndpointNotAllowed(f"the endpoint {shown} is a cloud metadata service's address: refused; "
                                         f"{hint.replace('lists it', 'lists that one address')}")
            reason = why_refused(address)
            if reason and not self.allow.allows_address(address):
                raise EndpointNotAllowed(f"the endpoint {shown} port {port} is {reason}: refused; {hint}")
        return tuple(str(address) for address in addresses)
