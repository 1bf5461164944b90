# SPDX-License-Identifier: Apache-2.0
"""Several hosts on one machine for the cluster tier's tests and benchmark:
network namespaces joined by veth pairs to a bridge in the master's
namespace (iproute2; root only). Each node runs its own kvpoold and
kvpool.cluster agent inside its namespace; Mooncake's master and metadata
server run in the master's. Engines stay in the test's process: they reach
their node's kvpoold over its ipc socket (a file, not the network)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from typing import Optional

import kvpool

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__))))))


def available() -> Optional[str]:
    """None if namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no iproute2 (ip)"
    venv = os.environ.get("KVP_MOONCAKE_VENV")
    if not venv or not os.path.exists(os.path.join(venv, "bin", "mooncake_master")):
        return "no Mooncake environment (KVP_MOONCAKE_VENV; tests/cluster/env.sh makes one)"
    return None


def docs_master_args() -> list[str]:
    """The arguments of docs/cluster.md's mooncake_master line, after
    checking that the page's pip line pins the version tests/cluster/env.sh
    installs (the one these tests run)."""
    import re
    import sys
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from conftest import check_docs  # clients/python/tests's
    cmds = check_docs.sh_commands(os.path.join(ROOT, "docs", "cluster.md"),
                                  "pip install mooncake")
    with open(os.path.join(ROOT, "tests", "cluster", "env.sh"), encoding="utf-8") as f:
        pin = re.search(r"^version=(\S+)", f.read(), re.M)
    assert len(cmds) == 2 and pin and cmds[0] == [
        "pip", "install", f"mooncake-transfer-engine-non-cuda=={pin.group(1)}"], cmds
    assert cmds[1][0] == "mooncake_master" and "--rpc_port=50051" in cmds[1] and \
        "--http_metadata_server_port=8080" in cmds[1], cmds[1]
    return cmds[1][1:]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


class Cluster:
    """A master namespace and nodes "a", "b", ...: start_master(),
    start_node(name, pool_args), agent(name), each process killable."""

    def __init__(self, tmp: str, nodes: list[str]) -> None:
        self.tmp = tmp
        tag = f"{os.getpid() % 100000:05d}"
        self.subnet = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
        self.ns = {n: f"kvpc{tag}{n}" for n in ["m", *nodes]}
        self.addr = {n: f"{self.subnet}.{i + 1}" for i, n in enumerate(["m", *nodes])}
        self.procs: dict[str, subprocess.Popen] = {}
        self.mc = os.environ["KVP_MOONCAKE_VENV"]
        self.urls: dict[str, tuple[str, str]] = {}
        for ns in self.ns.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        m = self.ns["m"]
        _ip("-n", m, "link", "add", "br0", "type", "bridge")
        _ip("-n", m, "addr", "add", f"{self.addr['m']}/24", "dev", "br0")
        _ip("-n", m, "link", "set", "br0", "up")
        for n in nodes:
            a, b = f"kc{tag}{n}", f"kc{tag}{n}x"
            _ip("link", "add", a, "type", "veth", "peer", "name", b)
            _ip("link", "set", a, "netns", self.ns[n])
            _ip("link", "set", b, "netns", m)
            _ip("-n", m, "link", "set", b, "master", "br0", "up")
            _ip("-n", self.ns[n], "addr", "add", f"{self.addr[n]}/24", "dev", a)
            _ip("-n", self.ns[n], "link", "set", a, "up")

    def run(self, where: str, name: str, argv: list[str], env: Optional[dict] = None,
            log: bool = True) -> subprocess.Popen:
        out = open(os.path.join(self.tmp, f"{name}.log"), "ab") if log else subprocess.DEVNULL
        p = subprocess.Popen(["ip", "netns", "exec", self.ns[where], *argv], stdout=out,
                             stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs[name] = p
        return p

    # ---- Mooncake's master (with its HTTP metadata server) ----
    @property
    def master(self) -> str:
        return f"{self.addr['m']}:50051"

    @property
    def metadata(self) -> str:
        return f"http://{self.addr['m']}:8080/metadata"

    def start_master(self) -> None:
        """mooncake_master as docs/cluster.md starts it, its line as written
        there (the RPC port and the metadata URL are this class's)."""
        self.run("m", "master", [os.path.join(self.mc, "bin", "mooncake_master"),
                                 *docs_master_args()])
        time.sleep(1.0)  # it prints nothing machine-readable when ready; setup retries anyway

    # ---- a node: kvpoold and the agent ----
    def start_node(self, n: str, pool_args: list[str], pool: str = "tier") -> str:
        d = os.path.join(self.tmp, n)
        os.makedirs(d, exist_ok=True)
        rpc, ev = f"ipc://{d}/rpc.ipc", f"ipc://{d}/events.ipc"
        kvpoold = os.environ.get("KVPOOLD") or os.path.join(ROOT, "build", "service", "kvpoold")
        self.run(n, f"kvpoold-{n}", [kvpoold, "--quiet", "--rpc", rpc, "--events", ev,
                                     "--admin", "none", "--region-dir", d, *pool_args])
        deadline = time.monotonic() + 10
        while True:
            try:
                kvpool.Client(rpc, pool=pool, timeout_ms=500, retries=0).close()
                break
            except (kvpool.Busy, kvpool.Unavailable):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"kvpoold on node {n} did not start")
                time.sleep(0.05)
        self.urls[n] = (rpc, ev)
        return rpc

    def agent(self, n: str, pool: str = "tier", extra: tuple[str, ...] = (),
              segment_mib: int = 64) -> str:
        rpc, ev = self.urls[n]
        stats = os.path.join(self.tmp, f"agent-{n}.json")
        if os.path.exists(stats):
            os.unlink(stats)
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "clients", "python"))
        self.run(n, f"agent-{n}", [os.path.join(self.mc, "bin", "python"), "-m",
                                   "kvpool.cluster", "--url", rpc, "--events", ev, "--pool",
                                   pool, "--master", self.master, "--metadata", self.metadata,
                                   "--host", self.addr[n], "--segment-mib", str(segment_mib),
                                   "--model", "opt-125m-test", "--layout", "fp32,h1,d8,l2,b16",
                                   "--stats-file", stats, *extra], env=env)
        return stats

    def wait_joined(self, n: str, timeout: float = 30.0) -> None:
        """Until node n's agent has both store workers running."""
        deadline = time.monotonic() + timeout
        while not self.stats(n).get("store_up"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"agent {n} did not join the store: {self.log(f'agent-{n}')}")
            time.sleep(0.1)

    def stats(self, n: str) -> dict:
        try:
            with open(os.path.join(self.tmp, f"agent-{n}.json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def wait_stats(self, n: str, key: str, at_least: int, timeout: float = 20.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.stats(n)
            if st.get(key, 0) >= at_least:
                return st
            p = self.procs.get(f"agent-{n}")
            if p is not None and p.poll() is not None:
                raise RuntimeError(f"agent {n} exited {p.returncode}: {self.log(f'agent-{n}')}")
            time.sleep(0.1)
        raise TimeoutError(f"agent {n}: {key} < {at_least} after {timeout} s: {self.stats(n)}")

    def log(self, name: str, tail: int = 4000) -> str:
        try:
            with open(os.path.join(self.tmp, f"{name}.log"), "rb") as f:
                return f.read()[-tail:].decode(errors="replace")
        except OSError:
            return ""

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs.pop(name, None)
        if p is not None and p.poll() is None:
            os.killpg(p.pid, sig)
            p.wait(timeout=30)

    def close(self) -> None:
        for name in list(self.procs):
            p = self.procs[name]
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM if name.startswith("kvpoold") else
                          signal.SIGKILL)
        for p in self.procs.values():
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs.clear()
        for ns in self.ns.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
