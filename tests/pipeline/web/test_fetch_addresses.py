"""Which addresses fetch connects to: the explicit table, every IPv6 form of a private IPv4 address, checked without
connecting anywhere and without `ipaddress`'s is_global (its answers move between patch releases)."""

import asyncio
import ipaddress

import pytest

from openalign.pipeline.web.fetch_addresses import IPV4, IPV6, Addresses
from openalign.pipeline.web.fetch_http import Client, Policy, PrivateAddress, safe_resolver

STRICT = Addresses(False)
PUBLIC_V4 = ("8.8.8.8", "1.1.1.1", "93.184.215.14", "151.101.1.140")


def nat64(v4: str, prefix: str = "64:ff9b::") -> str:
    return str(ipaddress.IPv6Address(int(ipaddress.IPv6Address(prefix)) | int(ipaddress.IPv4Address(v4))))


def mapped(v4: str) -> str:
    return str(ipaddress.IPv6Address(0xFFFF << 32 | int(ipaddress.IPv4Address(v4))))


def siit(v4: str) -> str:
    return str(ipaddress.IPv6Address(0xFFFF << 48 | int(ipaddress.IPv4Address(v4))))


def six_to_four(v4: str) -> str:
    return str(ipaddress.IPv6Address(0x2002 << 112 | int(ipaddress.IPv4Address(v4)) << 80 | 1))


def teredo(server: str, client: str) -> str:
    """RFC 4380 4: 2001:0000, the server's IPv4, flags, the port and the client's IPv4, both inverted."""
    return str(ipaddress.IPv6Address(0x20010000 << 96 | int(ipaddress.IPv4Address(server)) << 64 | 0x8000 << 48
                                     | (~0x1234 & 0xFFFF) << 32 | (~int(ipaddress.IPv4Address(client)) & 0xFFFFFFFF)))


def wrapped(v4: str) -> list[str]:
    """Every IPv6 form that carries `v4` and routes to it somewhere."""
    return [mapped(v4), siit(v4), nat64(v4), six_to_four(v4), teredo("65.54.227.120", v4), teredo(v4, "8.8.4.4")]


def test_the_forms_the_probe_found_are_refused():
    # Before: Addresses.allows relied on is_global and unwrapped only ::ffff:0:0/96, so each of these was allowed
    # (and in a loopback-only namespace a redirect to [::7f00:2] went on to a connection attempt).
    for form in ("64:ff9b::a9fe:a9fe", "64:ff9b::a00:1", "64:ff9b:1::a9fe:a9fe", "64:ff9b:1:ffff::1",
                 "2002:7f00:1::1", "2002:a9fe:a9fe::1", "::7f00:1", "::7f00:2", "::ffff:0:7f00:1", "fec0::1",
                 "100::1", "100::ffff:ffff:ffff:ffff", teredo("65.54.227.120", "127.0.0.1")):
        assert not STRICT.allows(form), form
        assert STRICT.refusal(form), form


def test_every_ipv6_form_of_a_refused_ipv4_address_is_refused():
    for rule in IPV4:
        net = ipaddress.IPv4Network(rule.network)
        for v4 in (str(net[0]), str(net[-1]), str(net[net.num_addresses // 2])):
            assert not STRICT.allows(v4), v4
            for form in wrapped(v4):
                assert not STRICT.allows(form), (v4, form)
                assert v4 in STRICT.refusal(form) or rule.network in STRICT.refusal(form), (v4, form)


def test_public_addresses_and_their_ipv6_forms_are_allowed():
    for v4 in PUBLIC_V4:
        assert STRICT.allows(v4), v4
        for form in wrapped(v4):
            assert STRICT.allows(form), (v4, form)
    for v6 in ("2606:4700:4700::1111", "2001:4860:4860::8888", "2a00:1450:4001:82b::200e", "2620:fe::fe"):
        assert STRICT.allows(v6), v6


def test_the_table_by_hand_at_each_boundary():
    """The edges of IANA's special-purpose ranges, written out by hand (not derived from the table)."""
    refused = ["0.0.0.0", "0.255.255.255", "10.0.0.0", "10.255.255.255", "100.64.0.0", "100.127.255.255",
               "127.0.0.1", "127.255.255.255", "169.254.169.254", "172.16.0.0", "172.31.255.255", "192.0.0.8",
               "192.0.2.1", "192.88.99.1", "192.168.0.1", "198.18.0.0", "198.19.255.255", "198.51.100.7",
               "203.0.113.9", "224.0.0.1", "239.255.255.255", "240.0.0.1", "255.255.255.255",
               "::", "::1", "fe80::1", "fe80::1%eth0", "febf:ffff::1", "fc00::1", "fdff:ffff::1", "ff02::1",
               "2001:db8::1", "2001:2::1", "2001:10::1", "2001:20::1", "3fff::1", "5f00::1", "4000::1", "1::1"]
    allowed = ["9.255.255.255", "11.0.0.0", "100.63.255.255", "100.128.0.0", "126.255.255.255", "128.0.0.0",
               "169.253.255.255", "169.255.0.0", "172.15.255.255", "172.32.0.0", "192.0.1.0", "192.167.255.255",
               "192.169.0.0", "198.17.255.255", "198.20.0.0", "223.255.255.255",
               "2000::1", "2001:200::1", "2003::1", "3ffe::1", "3fff:1000::1"]
    for address in refused:
        assert not STRICT.allows(address), address
    for address in allowed:
        assert STRICT.allows(address), address
    assert not STRICT.allows("not an address") and not STRICT.allows("")


def test_ipaddress_properties_are_not_consulted(monkeypatch):
    def moved(self):
        raise AssertionError("an ipaddress property whose answer depends on the Python release")

    for cls in (ipaddress.IPv4Address, ipaddress.IPv6Address):
        for name in ("is_global", "is_private", "is_reserved", "is_multicast", "is_link_local", "is_loopback",
                     "is_site_local", "is_unspecified", "ipv4_mapped", "sixtofour", "teredo"):
            if hasattr(cls, name):
                monkeypatch.setattr(cls, name, property(moved))
    assert not STRICT.allows("64:ff9b::a9fe:a9fe") and STRICT.allows("2606:4700:4700::1111")
    assert not STRICT.allows(teredo("65.54.227.120", "10.0.0.1")) and STRICT.allows("8.8.8.8")


def test_allowed_networks_and_allow_private():
    intranet = Addresses(False, ("10.1.0.0/16",))
    for form in ("10.1.200.3", mapped("10.1.200.3"), nat64("10.1.200.3"), six_to_four("10.1.200.3")):
        assert intranet.allows(form), form
    for form in ("10.2.0.1", nat64("10.2.0.1"), "127.0.0.1", "::1"):
        assert not intranet.allows(form), form
    everything = Addresses(True)
    for form in ("127.0.0.1", "169.254.169.254", "64:ff9b::a9fe:a9fe", "::7f00:1", "fec0::1", "ff02::1"):
        assert everything.allows(form), form
    assert not everything.allows("not an address")


def test_the_table_is_ordered_so_that_each_row_can_match():
    """A row wholly inside an earlier one would never decide: the table's order is what it means."""
    for table in (IPV4, IPV6):
        nets = [ipaddress.ip_network(r.network) for r in table]
        for i, later in enumerate(nets):
            assert not any(later.subnet_of(earlier) for earlier in nets[:i]), later


# ---------------------------------------------------------------------------------------------- where it is applied

def policy(**changes) -> Policy:
    settings = dict(user_agent="openalign-test", per_host=1, min_interval=0.0, max_crawl_delay=30.0, connections=4,
                    retries=0, max_retry_after=1.0, robots=True, opt_out=(), allow_private_addresses=False,
                    allow_networks=(), max_redirects=2, max_bytes=1 << 20, connect_timeout=1.0, read_timeout=1.0,
                    total_timeout=1.0)
    return Policy(**settings | changes)


@pytest.mark.parametrize("host", ["[64:ff9b::a9fe:a9fe]", "[::7f00:1]", "[2002:7f00:1::1]", "[::ffff:0:7f00:1]",
                                  "[fec0::1]", "[100::1]", "169.254.169.254"])
def test_an_ip_literal_in_a_url_is_refused_before_any_request(host):
    async def go():
        client = Client(policy())
        try:
            return await client.fetch(f"http://{host}:8080/cat.jpg")
        finally:
            await client.close()

    fetched = asyncio.run(go())
    assert fetched.kind == "private_address", fetched


def test_the_resolver_hands_on_only_allowed_addresses():
    class Answers:
        def __init__(self, hosts):
            self.hosts = hosts

        async def resolve(self, host, port=0, family=0):
            return [{"hostname": host, "host": h, "port": port, "family": 10, "proto": 6, "flags": 0}
                    for h in self.hosts]

        async def close(self):
            pass

    async def resolve(hosts):
        resolver = safe_resolver(STRICT)
        resolver.inner = Answers(hosts)
        return await resolver.resolve("images.example", 80)

    with pytest.raises(PrivateAddress, match=r"64:ff9b::a9fe:a9fe \(NAT64 well-known prefix of 169\.254\.169\.254"):
        asyncio.run(resolve(["64:ff9b::a9fe:a9fe", "::7f00:1"]))
    assert [r["host"] for r in asyncio.run(resolve(["2002:a9fe:a9fe::1", "2606:4700:4700::1111"]))] == [
        "2606:4700:4700::1111"]


def test_the_docs_list_every_range_as_the_table_has_it():
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[3] / "docs" / "pipeline.md").read_text(encoding="utf-8")
    for rule in IPV4 + IPV6:
        what = "refused" if rule.unwrap is None else "unwrapped: refused when an IPv4 address it carries is"
        assert f"| `{rule.network}` | {rule.name} | {what} | {rule.source} |" in docs, rule.network
    assert "`--allow-private-addresses` switches the check off" in docs
