# SPDX-License-Identifier: Apache-2.0
"""The cluster tier's keys and checks (kvpool.cluster_store), without a
store: object names under a namespace, the trailer a fill checks before a
row becomes KV (a foreign, stale or torn object is refused), and the refusal
of a public address (Mooncake Store has no authentication)."""
import os

import pytest

from kvpool.cluster import ClusterTier, TierConfig
from kvpool.cluster_store import (TRAILER, Namespace, StoreConfig, check_trailer, pack_trailer,
                                  private_address)

NS = Namespace("acme", "llama-3-8b", "bf16,h8,d128,l32,b16,tp0of1", 1 << 19, 1, 36)
KEY = bytes(range(32)) + b"\0\0\0\0"


def test_names_keep_namespaces_apart():
    other = [Namespace("other", NS.model, NS.layout, NS.row_bytes, 1, 36),
             Namespace(NS.tenant, "llama-3-70b", NS.layout, NS.row_bytes, 1, 36),
             Namespace(NS.tenant, NS.model, "fp16,h8,d128,l32,b16,tp0of1", NS.row_bytes, 1, 36),
             Namespace(NS.tenant, NS.model, NS.layout, NS.row_bytes, 2, 36)]
    names = {NS.name(KEY)} | {o.name(KEY) for o in other}
    assert len(names) == 5
    assert NS.name(KEY).startswith("kvpool/acme/") and NS.name(KEY).endswith(KEY.hex())
    assert NS.name(KEY) != NS.name(KEY[:-1] + b"\1")  # another group


def test_the_trailer_admits_only_this_namespace_and_key():
    t = pack_trailer(NS, KEY, 0xDEADBEEF)
    assert len(t) == TRAILER
    assert check_trailer(NS, KEY, t) == 0xDEADBEEF
    # a foreign namespace, another key, another row size, a torn or zeroed trailer
    assert check_trailer(Namespace("x", NS.model, NS.layout, NS.row_bytes, 1, 36), KEY, t) is None
    assert check_trailer(NS, KEY[:-1] + b"\1", t) is None
    assert check_trailer(Namespace(NS.tenant, NS.model, NS.layout, 4096, 1, 36), KEY, t) is None
    assert check_trailer(NS, KEY, t[:40]) is None
    assert check_trailer(NS, KEY, bytes(TRAILER)) is None
    flipped = bytearray(t)
    flipped[9] ^= 1  # inside the namespace digest
    assert check_trailer(NS, KEY, bytes(flipped)) is None


@pytest.mark.parametrize("addr,ok", [
    ("10.1.2.3", True), ("127.0.0.1:50051", True), ("192.168.0.9:8080", True),
    ("http://10.0.0.1:8080/metadata", True), ("[::1]:50051", True), ("169.254.1.1", True),
    ("8.8.8.8", False), ("http://1.1.1.1:8080/metadata", False), ("no-such-host.invalid", False)])
def test_private_addresses(addr, ok):
    assert private_address(addr) is ok


def test_the_agent_refuses_a_public_address_before_connecting():
    cfg = TierConfig(url="ipc:///nonexistent/kvpool.ipc", events="ipc:///nonexistent/ev.ipc",
                     model="m", layout="l",
                     store=StoreConfig(master="8.8.8.8:50051",
                                       metadata="http://10.0.0.1:8080/metadata",
                                       host="10.0.0.2"))
    with pytest.raises(ValueError, match="master address 8.8.8.8:50051 is not private"):
        ClusterTier(cfg)
    assert not os.path.exists("/nonexistent")
