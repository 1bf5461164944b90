# SPDX-License-Identifier: Apache-2.0
"""The cluster tier's fill (docs/cluster.md) against the store it rides on,
in one run, between two hosts made of network namespaces (root; Mooncake
Store from tests/cluster/env.sh, KVP_MOONCAKE_VENV):

  - kvpool: node b's lookup of keys node a committed, from the first
    lookup (answered pending) to every row committed (their BlockStored on
    b's event stream; a lookup then hits each): b's agent asks the store,
    reserves rows, has the store write each object straight into its row,
    checks it and commits (the time from a cross-node lookup to the rows
    being ready);
  - the store's own batch_get_into (multi-buffer, as the agent calls it) of
    the same objects into registered memory, by a client in b's namespace;
  - a raw TCP stream of the same bytes from a to b (one connection);
  - ReadBlocks over tcp of the same rows from a's kvpoold (today's path).

Node b lends the store no memory, so every object lives in a's segment and
every byte crosses the veth pair. Each repetition uses fresh keys; the four
ways run interleaved, and the medians are reported. Node b's pool holds two
repetitions' rows, so its fills reuse rows as a serving node's do: the store
worker has mapped them before (warm-up repetitions first), as the store's
own client reuses its one registered buffer. A worker's first touch of a row
costs page faults, once per row per worker life: the first warm-up
repetition is reported beside the others.

    sudo KVP_MOONCAKE_VENV=$(sh tests/cluster/env.sh) \\
        python3 clients/python/bench/bench_cluster.py [--quick] [BUILD_DIR]
"""
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "vllm033"))
sys.path.insert(0, os.path.join(ROOT, "tests", "bench"))

ROW_LAYERS, ROW_HEADS, ROW_HEAD = 8, 8, 128  # fp16, 16 tokens: 512 KiB rows
TCP_PORT, RPC_PORT = 47001, 47002


# ---- helpers run inside a namespace (python bench_cluster.py --helper ROLE ...) ----
def _serve_tcp(port):
    """Sends n bytes for each 8-byte request n, on one connection at a time."""
    data = bytearray(os.urandom(1 << 20))
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", port))
    ls.listen(1)
    print("ready", flush=True)
    while True:
        c, _ = ls.accept()
        with c:
            while True:
                hdr = c.recv(8, socket.MSG_WAITALL)
                if len(hdr) < 8:
                    break
                n = struct.unpack("<Q", hdr)[0]
                view = memoryview(data)
                while n > 0:
                    k = c.send(view[:min(n, len(data))])
                    n -= k


def _commands(handler):
    print("ready", flush=True)
    for line in sys.stdin:
        out = handler(line.split())
        print(out, flush=True)


def _tcp_client(host, port):
    s = socket.create_connection((host, int(port)))
    buf = bytearray(4 << 20)

    def one(args):
        n = int(args[0])
        t = time.perf_counter()
        s.sendall(struct.pack("<Q", n))
        left = n
        view = memoryview(buf)
        while left > 0:
            left -= s.recv_into(view[:min(left, len(buf))])
        return f"{time.perf_counter() - t:.9f}"
    _commands(one)


def _mc_get(master, metadata, host, row_bytes, n):
    import ctypes
    import mmap
    from mooncake.store import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    if s.setup(host, metadata, 0, 16 << 20, "tcp", "", master) != 0:
        sys.exit("bench_cluster: the raw client could not join the store")
    row_bytes, n = int(row_bytes), int(n)
    size = n * (row_bytes + 64)
    mm = mmap.mmap(-1, size)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    s.register_buffer(base, size)
    ptrs = [[base + i * row_bytes, base + n * row_bytes + i * 64] for i in range(n)]
    sizes = [[row_bytes, 64]] * n

    def one(names):
        t = time.perf_counter()
        got = s.batch_get_into_multi_buffers(names, ptrs[:len(names)], sizes[:len(names)])
        dt = time.perf_counter() - t
        if any(g != row_bytes + 64 for g in got):
            return f"error {got[:4]}"
        return f"{dt:.9f}"
    _commands(one)


def _read_blocks(url):
    import kvpool
    c = kvpool.Client(url, pool="tier", timeout_ms=30000)
    bufs = {}

    def one(hexkeys):
        keys = [bytes.fromhex(k) for k in hexkeys]
        t = time.perf_counter()
        rows, _ = c.lookup_and_lock(keys)
        bufs[len(rows)] = c.read_blocks(rows, bufs.get(len(rows)))  # reused after the first
        c.unlock(keys)
        return f"{time.perf_counter() - t:.9f}"
    _commands(one)


# ---- the driver ----
class _Helper:
    def __init__(self, net, where, name, args, python):
        full = ["ip", "netns", "exec", net.ns[where], python, os.path.abspath(__file__),
                "--helper", *[str(a) for a in args]]
        self.p = subprocess.Popen(full, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, start_new_session=True,
                                  env=dict(os.environ,
                                           PYTHONPATH=os.path.join(ROOT, "clients", "python")))
        net.procs[name] = self.p
        line = self.p.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"helper {name} did not start: {line!r}")

    def ask(self, *args):
        self.p.stdin.write(" ".join(str(a) for a in args) + "\n")
        self.p.stdin.flush()
        out = self.p.stdout.readline().strip()
        try:
            return float(out)
        except ValueError:
            raise RuntimeError(f"helper answered {out!r}") from None


def main():
    args = [a for a in sys.argv[1:] if a != "--quick"]
    quick = "--quick" in sys.argv
    build = args[0] if args else os.path.join(ROOT, "build")
    os.environ.setdefault("KVPOOL_LIB", os.path.join(build, "clients", "c", "libkvpool.so"))
    os.environ.setdefault("KVPOOLD", os.path.join(build, "service", "kvpoold"))
    import bench_json
    import cluster_net
    import kvpool
    from kvpool.cluster_store import Namespace
    why = cluster_net.available()
    if why:
        sys.exit(f"bench_cluster: {why}")
    reps, n = (3, 16) if quick else (7, 64)
    warm = 2  # repetitions that map b's rows in its store worker, untimed but the first
    blocks = (warm + reps) * n + 8

    def pool(rows):
        return (f"name=tier,blocks={rows},block_size=16,executor=cpu,layers={ROW_LAYERS},"
                f"heads={ROW_HEADS},head_size={ROW_HEAD},dtype=fp16,cluster_wait_ms=5000,"
                f"session_rows={rows}")
    mc_py = os.path.join(os.environ["KVP_MOONCAKE_VENV"], "bin", "python")
    tmp = tempfile.mkdtemp(prefix="kvpool-bench-cluster-")
    net = cluster_net.Cluster(tmp, ["a", "b"])
    try:
        net.start_master()
        net.start_node("a", ["--rpc", f"tcp://{net.addr['a']}:{RPC_PORT}", "--pool",
                             pool(blocks)])
        net.start_node("b", ["--pool", pool(warm * n + 8)])
        seg = ((warm + reps) * n * 600 >> 10) + 64  # MiB: every object, with room
        net.agent("a", segment_mib=seg)
        net.agent("b", segment_mib=0, extra=("--no-write-behind",))
        for x in "ab":
            net.wait_joined(x)
        wa = kvpool.Client(net.urls["a"][0], pool="tier")
        ra = wa.region()
        row = ra.row_bytes
        ns = Namespace("default", "opt-125m-test", "fp32,h1,d8,l2,b16", row, ra.shards,
                       wa.key_len)
        keys = [[os.urandom(32) + b"\0\0\0\0" for _ in range(n)] for _ in range(warm + reps)]
        for r in range(warm + reps):
            rows, _ = wa.reserve(keys[r])
            for i, rw in enumerate(rows):
                ra.row(rw)[:] = os.urandom(row)
            wa.commit(keys[r])
        net.wait_stats("a", "put", (warm + reps) * n, timeout=120)
        tcp_srv = net.run("a", "tcp-server", [sys.executable, os.path.abspath(__file__),
                                              "--helper", "tcp-server", str(TCP_PORT)],
                          log=False)
        time.sleep(0.5)
        tcp = _Helper(net, "b", "tcp-client", ["tcp-client", net.addr["a"], TCP_PORT],
                      sys.executable)
        mc = _Helper(net, "b", "mc-get", ["mc-get", net.master, net.metadata,
                                          net.addr["b"], row, n], mc_py)
        rb = _Helper(net, "b", "read-blocks",
                     ["read-blocks", f"tcp://{net.addr['a']}:{RPC_PORT}"], sys.executable)
        cb = kvpool.Client(net.urls["b"][0], pool="tier")
        with cb.region() as reg_b:  # b's rows allocated once, as a serving node's are
            zero = bytes(reg_b.row_bytes)
            for i in range(1, reg_b.num_rows):
                reg_b.row(i)[:] = zero
        nbytes = n * row
        tcp.ask(nbytes)  # warm each path once (connections, the first fault-ins)
        mc.ask(*[ns.name(k) for k in keys[0]])
        rb.ask(*[k.hex() for k in keys[0]])
        t_fill, t_mc, t_tcp, t_rb, t_cold = [], [], [], [], []

        # Rows ready = their commit's BlockStored on b's event stream (a
        # blocking wait: polling lookups every half millisecond took CPU from
        # the transfer on these 2 CPUs; an engine asks once a step).
        sub = kvpool.Subscriber(net.urls["b"][1], net.urls["b"][0], pools=["tier"],
                                index=False, int_hashes=False, timeout_ms=2000)

        def fill(ks):
            """From b's first lookup of ks (answered pending) to every row
            committed; then a lookup hits each with a's bytes."""
            sub.poll(0)  # what came before
            want, seen = set(ks), set()
            t0 = time.perf_counter()
            rows, _ = cb.lookup_and_lock(ks)
            if any(x != -2 for x in rows):
                raise RuntimeError(f"the first lookup was not pending: {rows}")
            while not want <= seen:
                for item in sub.poll(50):
                    for ev in getattr(item, "events", ()):
                        if isinstance(ev, kvpool.BlockStored) and ev.medium != "CLUSTER":
                            seen.update(bytes(h) + (ev.group_idx or 0).to_bytes(4, "big")
                                        for h in ev.block_hashes)
                if time.perf_counter() - t0 > 30:
                    raise RuntimeError(f"the fill missed {len(want - seen)} rows")
            dt = time.perf_counter() - t0
            rows, crcs = cb.lookup_and_lock(ks)
            assert all(x > 0 for x in rows), f"not every row hit after its commit: {rows}"
            rb_region = cb.region()
            for i, x in enumerate(rows):  # the bytes are a's, checked by CRC here
                assert rb_region.check(x, crcs[i]), f"row {i} differs"
            rb_region.close()
            cb.unlock(ks)
            return dt
        for r in range(warm):  # b's store worker maps the rows the fills reuse
            t_cold.append(fill(keys[r]))
        for r in range(warm, warm + reps):
            t_mc.append(mc.ask(*[ns.name(k) for k in keys[r]]))
            t_tcp.append(tcp.ask(nbytes))
            t_rb.append(rb.ask(*[k.hex() for k in keys[r]]))
            t_fill.append(fill(keys[r]))
        med = {k: statistics.median(v) for k, v in
               (("fill", t_fill), ("mc", t_mc), ("tcp", t_tcp), ("rb", t_rb))}
        gbs = {k: nbytes / v for k, v in med.items()}
        print(f"{n} rows of {row >> 10} KiB ({nbytes / 2**20:.0f} MiB) a -> b, medians of "
              f"{reps} interleaved repetitions:")
        for k, what in (("fill", "kvpool cluster fill (lookup to rows ready)"),
                        ("mc", "Mooncake batch_get_into (multi-buffer)"),
                        ("tcp", "raw TCP stream"), ("rb", "ReadBlocks over tcp")):
            print(f"  {what:48s} {med[k] * 1000:8.2f} ms  {gbs[k] / 1e9:6.3f} GB/s")
        print(f"  the first fill, into rows b's store worker never mapped: "
              f"{t_cold[0] * 1000:.2f} ms")
        print(f"  fill / store's get {gbs['fill'] / gbs['mc']:.2f}x; store's get / raw TCP "
              f"{gbs['mc'] / gbs['tcp']:.2f}x; fill / ReadBlocks {gbs['fill'] / gbs['rb']:.2f}x")
        area = "cluster"
        label = f"{n} rows of {row >> 10} KiB"
        bench_json.record(area, f"cluster fill, b from a's objects ({label})", gbs["fill"],
                          "B/s", "Mooncake's own batch_get_into of the same objects",
                          gbs["mc"], "higher")
        bench_json.record(area, f"cluster fill ({label})", gbs["fill"], "B/s",
                          "a raw TCP stream of the same bytes", gbs["tcp"], "higher")
        bench_json.record(area, f"Mooncake's batch_get_into ({label})", gbs["mc"], "B/s",
                          "a raw TCP stream of the same bytes", gbs["tcp"], "higher")
        bench_json.record(area, f"cluster fill ({label})", gbs["fill"], "B/s",
                          "ReadBlocks over tcp of the same rows", gbs["rb"], "higher")
        bench_json.note(area, f"a cross-node lookup to {n} rows ready: median "
                        f"{med['fill'] * 1000:.1f} ms (first lookup answered pending to every "
                        f"row committed); the first fill, into rows b's store worker had never mapped "
                        f"(a page fault per 4 KiB, once per row per worker life): "
                        f"{t_cold[0] * 1000:.1f} ms")
        del ra
        sub.close()
        wa.close()
        cb.close()
    finally:
        net.close()


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--helper":
        role, rest = sys.argv[2], sys.argv[3:]
        {"tcp-server": lambda: _serve_tcp(int(rest[0])),
         "tcp-client": lambda: _tcp_client(*rest),
         "mc-get": lambda: _mc_get(*rest),
         "read-blocks": lambda: _read_blocks(*rest)}[role]()
    else:
        main()
