"""Workers found in DNS: :class:`DnsWorkerResolver`.

Why DNS: where workers come and go under an orchestrator, the list of workers already is a DNS
answer. A Kubernetes headless Service has one A (or AAAA) record per ready pod and, for each
named port, SRV records naming every pod and its port; Consul, Nomad and plain zone files say
the same. Reading that answer needs no credentials and no client library of the platform, only
a DNS library (dnspython, the ``fleet`` extra, imported when a resolver is made, so that
``import flight`` stays light).

The lookups run where every dynamic resolver's do (:class:`PollingWorkerResolver`): once at
construction, then on a background thread every ``interval`` seconds; ``get_urls()`` never waits
for DNS. What an answer means:

* records: one URL per address (per SRV target and port), sorted, without duplicates;
* NXDOMAIN, or a name without records of the type asked: no workers, an empty list, served as
  such (a service scaled to zero is a valid state; the planner reports the empty list);
* a timeout, SERVFAIL or REFUSED: the lookup failed; the last good list stays, ``last_error``
  says why, and a warning is logged once, as for any failed refresh.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import re
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal, cast

from flight.coordinator.resolver import PollingWorkerResolver, normalize_url, register_description_kind
from flight.errors import ResolverError

if TYPE_CHECKING:
    import dns.message
    import dns.resolver

__all__ = ["DnsWorkerResolver"]

logger = logging.getLogger(__name__)

Family = Literal["any", "ipv4", "ipv6"]
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

_RDTYPES: dict[str, tuple[str, ...]] = {"any": ("A", "AAAA"), "ipv4": ("A",), "ipv6": ("AAAA",)}
_SCHEMES = ("grpc", "grpc+tcp", "grpc+tls")
_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")
_MAX_NAME_LENGTH = 253


def _bad(field: str, value: object, what: str) -> ResolverError:
    return ResolverError(f"DnsWorkerResolver: {field} {value!r} {what}.")


def _check_name(name: object) -> str:
    """The DNS name, lower-cased; a trailing dot (an absolute name) is kept."""
    if not isinstance(name, str):
        raise _bad("name", name, "is not a string; pass a DNS name such as 'workers.flight.svc.cluster.local'")
    text = name.strip().lower()
    bare = text.removesuffix(".")
    if not bare:
        raise _bad("name", name, "is empty; pass a DNS name such as 'workers.flight.svc.cluster.local'")
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        pass
    else:
        raise _bad("name", name, "is an IP address, not a DNS name; give fixed addresses to StaticWorkerResolver")
    if len(bare) > _MAX_NAME_LENGTH:
        raise _bad("name", name, f"is {len(bare)} characters long; a DNS name has at most {_MAX_NAME_LENGTH}")
    for label in bare.split("."):
        if not _LABEL.fullmatch(label):
            raise _bad("name", name, f"has the label {label!r}: a label is 1 to 63 letters, digits, '-' or '_', not starting or ending with '-'")
    return text


def _check_port(port: object, name: str) -> int | None:
    if port is None:
        return None
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise _bad("port", port, "is not an integer in 1..65535 (or None, to read the ports from SRV records)")
    if name.startswith("_"):
        raise _bad("port", port, f"is given, but {name!r} is an SRV name (_service._proto.name) whose records carry the ports; pass port=None")
    return port


def _check_choice(field: str, value: object, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise _bad(field, value, f"is not one of {', '.join(map(repr, choices))}")
    return value


def _check_timeout(timeout: object) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (math.isfinite(timeout) and timeout > 0):
        raise _bad("timeout", timeout, "is not a positive, finite number of seconds")
    return float(timeout)


def _parse_nameserver(entry: object) -> tuple[str, int]:
    """``ip``, ``ip:port``, ``v6`` or ``[v6]:port`` → (address, port); port 53 by default."""
    if not isinstance(entry, str):
        raise _bad("nameserver", entry, "is not a string such as '10.96.0.10' or '127.0.0.1:5353'")
    text = entry.strip()
    host, port_text = text, ""
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise _bad("nameserver", entry, "is not '[IPv6 address]:port'")
        port_text = rest[1:]
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise _bad("nameserver", entry, "is not an IP address (optionally with :port; an IPv6 one in brackets)") from None
    if not port_text:
        return str(address), 53
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise _bad("nameserver", entry, f"has the port {port_text!r}, not an integer in 1..65535")
    return str(address), int(port_text)


def _check_nameservers(nameservers: object) -> tuple[tuple[str, int], ...] | None:
    if nameservers is None:
        return None
    if isinstance(nameservers, (str, bytes)):
        raise _bad("nameservers", nameservers, "is a single string; wrap it in a list")
    if not isinstance(nameservers, Sequence) or not nameservers:
        raise _bad("nameservers", nameservers, "is not a non-empty list of addresses (or None, for the system's resolver configuration)")
    return tuple(dict.fromkeys(_parse_nameserver(entry) for entry in nameservers))


def _server_text(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return host if port == 53 else f"{host}:{port}"


def _url(scheme: str, address: Address, port: int) -> str:
    host = f"[{address}]" if address.version == 6 else str(address)
    return normalize_url(f"{scheme}://{host}:{port}")


def _additional_addresses(response: dns.message.Message, rdtypes: Sequence[str]) -> dict[str, list[Address]]:
    """The addresses a response's Additional section gives for each name (absolute, lower-case)."""
    import dns.rdatatype

    wanted = {dns.rdatatype.from_text(t) for t in rdtypes}
    found: dict[str, list[Address]] = {}
    for rrset in response.additional:
        if rrset.rdtype in wanted:
            found.setdefault(rrset.name.to_text().lower(), []).extend(ipaddress.ip_address(r.address) for r in rrset)
    return found


class _Lookup:
    """One refresh's DNS queries and what their answers mean: the ``fetch`` of a DnsWorkerResolver.

    Called once at construction, then only on the refresh thread, so the dnspython resolver
    inside is never used by two threads at once. One refresh takes at most ``timeout`` seconds.
    """

    def __init__(
        self, name: str, port: int | None, scheme: str, family: str, nameservers: tuple[tuple[str, int], ...] | None, timeout: float
    ) -> None:
        try:
            import dns.exception
            import dns.nameserver
            import dns.resolver
        except ImportError as exc:
            raise ResolverError("DnsWorkerResolver needs dnspython: pip install 'flight-exec[fleet]'") from exc
        self.name, self.port, self.scheme, self.timeout = name, port, scheme, timeout
        self.rdtypes = _RDTYPES[family]
        try:
            self.resolver = dns.resolver.Resolver(configure=nameservers is None)
        except dns.exception.DNSException as exc:
            raise ResolverError(f"DnsWorkerResolver: cannot read the system's DNS configuration ({exc}); pass nameservers=[...]") from exc
        if nameservers is not None:
            self.resolver.nameservers = [dns.nameserver.Do53Nameserver(address, port) for address, port in nameservers]
        self.resolver.timeout = timeout
        self.resolver.cache = None  # every refresh asks the server: a change is seen at the next one
        self.servers = ", ".join(str(ns) for ns in self.resolver.nameservers)

    def __call__(self) -> list[str]:
        deadline = time.monotonic() + self.timeout
        if self.port is not None:
            pairs = [(address, self.port) for address in self._addresses(self.name, deadline)]
        else:
            pairs = self._srv(deadline)
        ordered = sorted(set(pairs), key=lambda pair: (pair[0].version, int(pair[0]), pair[1]))
        return [_url(self.scheme, address, port) for address, port in ordered]

    def _query(self, qname: str, rdtype: str, deadline: float) -> dns.resolver.Answer | None:
        """The answer (its ``rrset`` is None when the name has no such records), or None for NXDOMAIN."""
        import dns.exception
        import dns.resolver

        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ResolverError(f"DNS lookup of {qname!r} took longer than timeout={self.timeout:g} s (servers: {self.servers})")
        try:
            return self.resolver.resolve(qname, rdtype, raise_on_no_answer=False, lifetime=remaining, search=True)
        except dns.resolver.NXDOMAIN:
            return None
        except dns.exception.DNSException as exc:
            raise ResolverError(f"DNS lookup of {rdtype} records for {qname!r} failed: {exc}") from exc

    def _addresses(self, qname: str, deadline: float) -> list[Address]:
        found: list[Address] = []
        for rdtype in self.rdtypes:
            answer = self._query(qname, rdtype, deadline)
            if answer is not None and answer.rrset is not None:
                found.extend(ipaddress.ip_address(r.address) for r in answer.rrset)
        return found

    def _srv(self, deadline: float) -> list[tuple[Address, int]]:
        """Each SRV target's addresses with its port: from the Additional section, else looked up."""
        answer = self._query(self.name, "SRV", deadline)
        if answer is None or answer.rrset is None:
            return []
        additional = _additional_addresses(answer.response, self.rdtypes)
        pairs: list[tuple[Address, int]] = []
        for record in answer.rrset:
            target = record.target.to_text().lower()
            if target == ".":  # "decidedly not available here" (RFC 2782)
                continue
            if record.port == 0:
                raise ResolverError(f"DNS: the SRV record {self.name!r} -> {target} has port 0, which no worker listens on")
            addresses = additional.get(target) or self._addresses(target, deadline)
            if not addresses:
                logger.debug("DNS: the SRV target %s of %s has no address; skipped", target, self.name)
            pairs.extend((address, record.port) for address in addresses)
        return pairs


class DnsWorkerResolver(PollingWorkerResolver):
    """Workers from DNS records, refreshed in the background (needs the ``fleet`` extra: dnspython).

    With ``port``: the A and AAAA records of ``name`` (a Kubernetes headless Service, say
    ``workers.flight.svc.cluster.local``), one URL per address with that port. Without ``port``
    (which a name of the form ``_service._proto.name`` must be given without): its SRV records,
    each target's addresses with the record's port (priority and weight are ignored: every
    target is a worker). ``family`` keeps only IPv4 (``"ipv4"``) or IPv6 (``"ipv6"``)
    addresses: a dual-stack worker has both, and would otherwise count as two.

    ``nameservers``: the DNS servers to ask (``"10.96.0.10"``, ``"127.0.0.1:5353"``,
    ``"[::1]:53"``); by default the system's (``/etc/resolv.conf``, with its search
    domains). ``timeout``: the most one refresh may take. ``scheme``: ``"grpc"`` or
    ``"grpc+tls"`` (then the workers' certificates must name the addresses).

    A bad argument raises :class:`~flight.errors.ResolverError` naming it, and so does a
    failed first lookup; after that, a failed lookup keeps the last good list (module docs).
    """

    def __init__(
        self,
        name: str,
        port: int | None = None,
        *,
        scheme: str = "grpc",
        family: Family = "any",
        interval: float = 5.0,
        nameservers: Sequence[str] | None = None,
        timeout: float = 2.0,
    ) -> None:
        self._dns_name = _check_name(name)
        self._port = _check_port(port, self._dns_name)
        self._scheme = _check_choice("scheme", scheme, _SCHEMES)
        self._family = cast(Family, _check_choice("family", family, tuple(_RDTYPES)))
        self._nameservers = _check_nameservers(nameservers)
        self._timeout = _check_timeout(timeout)
        lookup = _Lookup(self._dns_name, self._port, self._scheme, self._family, self._nameservers, self._timeout)
        super().__init__(lookup, interval, name=f"dns {self._dns_name}")

    @property
    def dns_name(self) -> str:
        return self._dns_name

    @property
    def port(self) -> int | None:
        """The workers' port, or None when SRV records give it."""
        return self._port

    def describe(self) -> dict[str, object]:
        servers = None if self._nameservers is None else [_server_text(a, p) for a, p in self._nameservers]
        return {
            "kind": "dns",
            "name": self._dns_name,
            "port": self._port,
            "scheme": self._scheme,
            "family": self._family,
            "interval": self.interval,
            "nameservers": servers,
            "timeout": self._timeout,
        }

    @classmethod
    def from_description(cls, d: Mapping[str, object]) -> DnsWorkerResolver:
        """The resolver :meth:`describe` described; a malformed description is a ResolverError."""
        interval = d.get("interval", 5.0)
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not (math.isfinite(interval) and interval > 0):
            raise ResolverError(f"a dns resolver description's 'interval' must be a positive number of seconds; got {interval!r}.")
        return cls(  # every other field is checked by the constructor, which names it
            cast(str, d.get("name")),
            cast("int | None", d.get("port")),
            scheme=cast(str, d.get("scheme", "grpc")),
            family=cast(Family, d.get("family", "any")),
            interval=interval,
            nameservers=cast("Sequence[str] | None", d.get("nameservers")),
            timeout=cast(float, d.get("timeout", 2.0)),
        )

    def __repr__(self) -> str:
        where = f"{self._dns_name!r}" + ("" if self._port is None else f", {self._port}")
        return f"DnsWorkerResolver({where}, interval={self.interval}, urls={len(self.get_urls())})"


register_description_kind("dns", DnsWorkerResolver.from_description)
