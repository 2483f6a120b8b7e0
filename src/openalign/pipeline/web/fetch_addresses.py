"""Which IP addresses fetch may connect to: one explicit table, read the same on every Python release.

A crawl's URLs point wherever their authors like, and a fetch runs inside somebody's network: a URL, a redirect or a
DNS answer naming 169.254.169.254 (the cloud metadata service), 127.0.0.1 or 10.0.0.1 would make the crawler a
proxy into it. So every address a connection would go to is looked up here first, and the first range that holds
it decides:

- a range marked **refused** is never connected to (`private_address`);
- a range marked **unwrapped** is an IPv6 form that carries IPv4 addresses (IPv4-mapped, SIIT, NAT64, 6to4,
  Teredo): each IPv4 address inside is looked up in turn, and the address is refused if any of them is;
- an address in no range is public, and allowed.

The tables are IANA's special-purpose address registries (RFC 6890 and its updates) as of 2026, plus what IANA
has not allocated for unicast (IPv6 outside 2000::/3; IPv4's 240.0.0.0/4) and what is deprecated but still
routed by some stacks (IPv4-compatible ::/96, site-local fec0::/10: Linux tried to connect to ::7f00:2).
`ipaddress`'s `is_global` and `is_private` are not used: their answers changed between patch releases (3.11.10
and 3.12.4 changed 2002::/16), and a safety rule must not move with the interpreter.

`allow_private` (`--allow-private-addresses`) switches the check off: every address is connected to.
`networks` (`--allow-network 10.1.0.0/16`, repeatable) are allowed although a range refuses them; an IPv6 form
that carries an IPv4 address of an allowed network is allowed too.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from collections.abc import Callable

__all__ = ["IPV4", "IPV6", "Addresses", "Range"]

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
LOW32 = 0xFFFF_FFFF


@dataclass(frozen=True)
class Range:
    network: str
    name: str  # what it is, in the refusal's detail and the docs' table
    source: str  # where it is defined
    unwrap: Callable[[int], tuple[int, ...]] | None = None  # the IPv4 addresses (as integers) an address carries

    @property
    def net(self):
        return ipaddress.ip_network(self.network)


def _last_32(value: int) -> tuple[int, ...]:
    return (value & LOW32,)


def _six_to_four(value: int) -> tuple[int, ...]:
    return ((value >> 80) & LOW32,)  # 2002:AABB:CCDD::/48 carries AA.BB.CC.DD


def _teredo(value: int) -> tuple[int, ...]:
    return ((value >> 64) & LOW32, ~value & LOW32)  # the server's address, and the client's (stored inverted)


IPV4 = (
    Range("0.0.0.0/8", "'this network' (Linux connects 0.0.0.0 to itself)", "RFC 791, RFC 1122 3.2.1.3"),
    Range("10.0.0.0/8", "private", "RFC 1918"),
    Range("100.64.0.0/10", "shared address space (carrier-grade NAT)", "RFC 6598"),
    Range("127.0.0.0/8", "loopback", "RFC 1122 3.2.1.3"),
    Range("169.254.0.0/16", "link-local (169.254.169.254: cloud metadata)", "RFC 3927"),
    Range("172.16.0.0/12", "private", "RFC 1918"),
    Range("192.0.0.0/24", "IETF protocol assignments", "RFC 6890"),
    Range("192.0.2.0/24", "documentation (TEST-NET-1)", "RFC 5737"),
    Range("192.88.99.0/24", "6to4 relay anycast (deprecated)", "RFC 7526"),
    Range("192.168.0.0/16", "private", "RFC 1918"),
    Range("198.18.0.0/15", "benchmarking", "RFC 2544"),
    Range("198.51.100.0/24", "documentation (TEST-NET-2)", "RFC 5737"),
    Range("203.0.113.0/24", "documentation (TEST-NET-3)", "RFC 5737"),
    Range("224.0.0.0/4", "multicast", "RFC 5771"),
    Range("240.0.0.0/4", "reserved (and 255.255.255.255, broadcast)", "RFC 1112, RFC 919"),
)

IPV6 = (
    Range("::/128", "unspecified", "RFC 4291 2.5.2"),
    Range("::1/128", "loopback", "RFC 4291 2.5.3"),
    Range("::ffff:0:0/96", "IPv4-mapped", "RFC 4291 2.5.5.2", _last_32),
    Range("::ffff:0:0:0/96", "IPv4-translated (SIIT)", "RFC 7915", _last_32),
    Range("::/96", "IPv4-compatible (deprecated)", "RFC 4291 2.5.5.1"),
    Range("64:ff9b::/96", "NAT64 well-known prefix", "RFC 6052", _last_32),
    Range("64:ff9b:1::/48", "NAT64 local-use prefix", "RFC 8215"),
    Range("100::/64", "discard-only", "RFC 6666"),
    Range("2001::/32", "Teredo", "RFC 4380", _teredo),
    Range("2001:db8::/32", "documentation", "RFC 3849"),
    Range("2001::/23", "IETF protocol assignments (benchmarking, ORCHID, anycast services)", "RFC 2928, RFC 6890"),
    Range("2002::/16", "6to4", "RFC 3056", _six_to_four),
    Range("3fff::/20", "documentation", "RFC 9637"),
    Range("5f00::/16", "segment routing (SRv6) SIDs", "RFC 9602"),
    Range("fc00::/7", "unique local (private)", "RFC 4193"),
    Range("fe80::/10", "link-local", "RFC 4291 2.5.6"),
    Range("fec0::/10", "site-local (deprecated)", "RFC 3879"),
    Range("ff00::/8", "multicast", "RFC 4291 2.7"),
    # what is left outside the global unicast space 2000::/3: unassigned by IANA, or reserved
    Range("::/3", "reserved by IETF (outside global unicast 2000::/3)", "RFC 4291 2.4"),
    Range("4000::/2", "unassigned (outside global unicast 2000::/3)", "RFC 4291 2.4"),
    Range("8000::/1", "unassigned (outside global unicast 2000::/3)", "RFC 4291 2.4"),
)

_NETS = {4: tuple((r.net, r) for r in IPV4), 6: tuple((r.net, r) for r in IPV6)}


def parse(address: str) -> IP | None:
    """An address as a resolver or a URL gives it ('fe80::1%eth0', '[::1]'), or None."""
    try:
        return ipaddress.ip_address(str(address).strip("[]").split("%", 1)[0])
    except ValueError:
        return None


class Addresses:
    """Which IP addresses may be connected to (the module's docstring)."""

    def __init__(self, allow_private: bool, networks: tuple[str, ...] = ()):
        self.allow_private = allow_private
        self.networks = tuple(ipaddress.ip_network(n, strict=False) for n in networks)

    def allows(self, address: str) -> bool:
        return self.refusal(address) is None

    def refusal(self, address: str) -> str | None:
        """Why `address` may not be connected to, in a few words, or None when it may."""
        ip = parse(address)
        if ip is None:
            return "not an IP address"
        return None if self.allow_private else self._refusal(ip)

    def _refusal(self, ip: IP) -> str | None:
        if any(ip in net for net in self.networks if net.version == ip.version):
            return None
        for net, rule in _NETS[ip.version]:
            if ip not in net:
                continue
            if rule.unwrap is None:
                return f"{rule.name}, {rule.network}"
            for inner in map(ipaddress.IPv4Address, rule.unwrap(int(ip))):
                why = self._refusal(inner)
                if why is not None:
                    return f"{rule.name} of {inner}: {why}"
            return None
        return None
