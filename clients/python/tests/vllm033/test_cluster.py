# SPDX-License-Identifier: Apache-2.0
"""The cluster tier (docs/cluster.md) across hosts made of network
namespaces: Mooncake's master in one, nodes a, b and c each with its own
kvpoold and kvpool.cluster agent, and vLLM 0.33 engines (its Scheduler and
OffloadingConnector on kvpool's spec, CPU tensors) on the nodes' pools.

An engine on b serves a prompt prefilled on a, loading every full block
from the cluster with a's bytes; a decode engine on c takes the same
prefill; the master killed and restarted, then node a killed: no engine
exception, no wrong bytes, misses meanwhile, hits again after. Every
node's kvpoold announces the blocks the cluster holds (medium CLUSTER)
and retracts them once a fill finds the store lost them."""
import json
import os
import time

import pytest

import cluster_net

why = cluster_net.available()
if why:
    pytest.skip(why, allow_module_level=True)

import torch  # noqa: E402

import kvpool  # noqa: E402

from test_offload import BS, PROMPT, Engine, model_dir, pattern, tier_args  # noqa: E402,F401

WAIT_MS = 2000  # a missed key waits this long on the cluster (plenty here)
STEP_LIMIT_S = 1.1  # kvpool_timeout_ms (the scheduler's 1000) + 100 ms


@pytest.fixture
def cluster(tmp_path):
    c = cluster_net.Cluster(str(tmp_path), ["a", "b", "c"])
    try:
        c.start_master()
        for n in "abc":
            c.start_node(n, list(tier_args(
                tmp_path / n, blocks=64,
                extra=f",cluster_wait_ms={WAIT_MS},cluster_miss_ms=100")))
            c.agent(n)
        for n in "abc":  # each agent joined the store and calls ClusterFill
            c.wait_joined(n)
        yield c
    finally:
        for n in "abc":
            print(f"--- agent {n}: {c.stats(n)}\n{c.log(f'agent-{n}', 1500)}")
        c.close()


def prefill(engine, prompt, limit_s=30.0):
    """Steps engine until it served prompt (its lookups may wait on the
    cluster up to cluster_wait_ms: a fill, or the store's deadline)."""
    req = engine.add(prompt)
    deadline = time.monotonic() + limit_s
    while not (req.is_finished() and not engine.conn._jobs and
               not engine.manager.has_pending_work()):
        assert time.monotonic() < deadline, "the request did not finish"
        engine.step()
    return [bytes(h) for h in req.block_hashes[:len(prompt) // BS]]


def served_from_cluster(engine, prompt, hashes, steps=20000):
    """The engine serves prompt: every full block loaded, each with the
    bytes the prefilling engine computed. Returns the tokens it computed."""
    req = engine.add(prompt)
    step, longest = engine.step, [0.0]

    def timed(*a, **kw):
        t = time.monotonic()
        try:
            return step(*a, **kw)
        finally:
            longest[0] = max(longest[0], time.monotonic() - t)
    engine.step = timed
    try:
        first, loaded = engine.serve(req, steps=steps)
    finally:
        del engine.step
    assert req.is_finished(), "the request did not finish"
    # No step waits on the cluster: kvpoold answers (pending) at once.
    assert longest[0] < STEP_LIMIT_S, f"a step took {longest[0] * 1000:.0f} ms"
    n = min(len(hashes), 4)
    for i in range(n):
        for got in loaded[i]:
            assert torch.equal(got, pattern(hashes[i] + b"\0", engine.page)), \
                f"block {i}'s bytes differ from the prefilling engine's"
    return first


def test_a_prompt_prefilled_on_one_node_is_a_hit_on_the_others(model_dir, cluster):
    a = Engine(model_dir, cluster.urls["a"][0], "engine-a")
    hashes = prefill(a, PROMPT)
    cluster.wait_stats("a", "put", len(hashes))  # a's agent put every committed block
    b = Engine(model_dir, cluster.urls["b"][0], "engine-b")
    t0 = time.monotonic()
    first = served_from_cluster(b, PROMPT, hashes)
    took = time.monotonic() - t0
    assert first == len(PROMPT) - 4 * BS, f"b computed {first} tokens, not only the tail"
    st = cluster.wait_stats("b", "filled", 4)
    assert st["corrupt"] == 0
    print(f"cross-node: b served a's 4 blocks from the cluster in {took * 1000:.1f} ms")
    # P/D: a decode-only engine on c takes the prefill a handed over, the same way.
    c = Engine(model_dir, cluster.urls["c"][0], "engine-c-decode")
    first = served_from_cluster(c, PROMPT, hashes)
    assert first == len(PROMPT) - 4 * BS
    for e in (a, b, c):
        e.close()


def _cluster_events(subs, want, timeout=20.0):
    """Reads each node's event stream until every one of them has told,
    in medium CLUSTER, the keys of want ({"stored"|"removed": keys})."""
    seen = {n: {"stored": set(), "removed": set()} for n in subs}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for n, sub in subs.items():
            for item in sub.poll(20):
                for ev in getattr(item, "events", ()):
                    if ev.medium == "CLUSTER":
                        kind = "stored" if isinstance(ev, kvpool.BlockStored) else "removed"
                        seen[n][kind].update(bytes(h) + (ev.group_idx or 0).to_bytes(4, "big")
                                             for h in ev.block_hashes)
        if all(set(keys) <= seen[n][kind] for n in subs for kind, keys in want.items()):
            return seen
    raise TimeoutError(f"not every node told {want}: {seen}")


def _lose_blocks(cluster, n):
    """Removes the n block objects from the store (the announcement log's
    entries stay), by a client of the store's own in the master's namespace;
    an object read in the last seconds is leased and refuses removal until
    its lease ends, so the remover tries again for up to 30 s."""
    rm = cluster.run("m", "remover", [
        os.path.join(cluster.mc, "bin", "python"), "-c",
        "import sys, time\n"
        "from mooncake.store import MooncakeDistributedStore as S\n"
        "s = S()\n"
        f"assert s.setup('{cluster.addr['m']}', '{cluster.metadata}', 0, 16 << 20, "
        f"'tcp', '', '{cluster.master}') == 0\n"
        "n, t = 0, time.time()\n"
        f"while n < {n} and time.time() - t < 30:\n"
        "    n += max(0, s.remove_by_regex(r'^kvpool/[^/]+/[0-9a-f]{16}/[0-9a-f]+$'))\n"
        "    time.sleep(0.2)\n"
        "print('removed', n)\n"
        f"sys.exit(0 if n >= {n} else 1)\n"])
    assert rm.wait(timeout=60) == 0, cluster.log("remover")


def test_routers_see_the_clusters_blocks_on_every_node(model_dir, cluster):
    """Blocks node a put are announced by every node's kvpoold (medium
    CLUSTER, vLLM's locality REMOTE on its wire), so a router credits every
    node's engines with them; once the store has lost them, the first node
    whose fill finds them gone has every node announce their removal."""
    subs = {n: kvpool.Subscriber(cluster.urls[n][1], cluster.urls[n][0], pools=["tier"],
                                 index=False, int_hashes=False, timeout_ms=2000)
            for n in "abc"}
    try:
        a = Engine(model_dir, cluster.urls["a"][0], "engine-a")
        hashes = prefill(a, PROMPT)
        cluster.wait_stats("a", "put", len(hashes))
        keys = [h + b"\0\0\0\0" for h in hashes]
        t0 = time.monotonic()
        _cluster_events(subs, {"stored": keys})
        print(f"every node announced a's {len(keys)} blocks within "
              f"{(time.monotonic() - t0) * 1000:.0f} ms of the puts")
        # The store loses the blocks (removed behind the tier's back, as an
        # eviction would): c's lookups miss, and every node retracts them.
        _lose_blocks(cluster, len(keys))
        c = Engine(model_dir, cluster.urls["c"][0], "engine-c")
        assert served_from_cluster(c, PROMPT, []) == len(PROMPT)  # nothing to load
        _cluster_events(subs, {"removed": keys})
        deadline = time.monotonic() + 5  # the stats files are rewritten each half second
        while any(cluster.stats(n).get("announced") for n in "abc"):
            assert time.monotonic() < deadline, [cluster.stats(n) for n in "abc"]
            time.sleep(0.1)
        for e in (a, c):
            e.close()
    finally:
        for sub in subs.values():
            sub.close()


def test_master_and_node_faults_never_fail_an_engine(model_dir, cluster):
    a = Engine(model_dir, cluster.urls["a"][0], "engine-a")
    b = Engine(model_dir, cluster.urls["b"][0], "engine-b")
    prompts = [list(range(k * 7000, k * 7000 + 4 * BS + 3)) for k in range(6)]

    # The master killed: b's lookups miss (it computes everything), nothing raises.
    cluster.kill("master")
    hashes = prefill(a, prompts[0])
    t0 = time.monotonic()
    first = served_from_cluster(b, prompts[0], [])
    assert first == len(prompts[0]), "a hit while the store's master was down"
    assert time.monotonic() - t0 < WAIT_MS / 1000 + 5

    # Restarted: the agents set up new clients; a new prefill is a hit on b again.
    # Each try is a prompt neither node has seen: b computes a prompt it
    # missed, and that one would be a hit from b's own region next time.
    cluster.start_master()
    deadline = time.monotonic() + 60
    k = 1
    while True:
        prompt = prompts[k] if k < 4 else list(range(2_000_000 + k * 300,
                                                      2_000_000 + k * 300 + 4 * BS + 3))
        hashes = prefill(a, prompt)
        try:
            cluster.wait_stats("a", "put", 4, timeout=5)
        except TimeoutError:
            pass
        first = served_from_cluster(b, prompt, hashes)
        if first == len(prompt) - 4 * BS:
            break
        assert time.monotonic() < deadline, "no cross-node hit within 60 s of the restart"
        k = k + 1 if k + 1 < 4 else max(k + 1, 10)
    before = cluster.wait_stats("b", "filled", 4)["filled"]  # that hit was a fill

    # Node a killed (its agent and kvpoold, and the store's objects in its
    # segment): b misses or hits with a's bytes, never wrong ones, never raises.
    cluster.kill("agent-a")
    cluster.kill("kvpoold-a")
    for p in prompts[4:6]:
        served_from_cluster(b, p, [])
    assert cluster.procs["kvpoold-b"].poll() is None
    # b's new blocks still go to the cluster and come back on c (once the
    # master has dropped a's segment, puts place them on the living nodes).
    c = Engine(model_dir, cluster.urls["c"][0], "engine-c")
    deadline = time.monotonic() + 60
    for k in range(100, 1000):
        fresh = list(range(k * 300, k * 300 + 4 * BS + 3))
        hashes = prefill(b, fresh)
        try:
            cluster.wait_stats("b", "put", cluster.stats("b").get("put", 0) + 4, timeout=3)
        except TimeoutError:
            pass
        if served_from_cluster(c, fresh, hashes) == len(fresh) - 4 * BS:
            break
        assert time.monotonic() < deadline, "no hit on c from b's blocks within 60 s"
    assert cluster.wait_stats("c", "filled", 4)["corrupt"] == 0
    assert cluster.stats("b")["corrupt"] == 0 and cluster.stats("b")["filled"] >= before
    for e in (b, c):
        e.close()
    a.manager.shutdown()


def _one_node(tmp_path, agent_args):
    """A master and node a, its agent run with agent_args; stats printed at the end."""
    c = cluster_net.Cluster(str(tmp_path), ["a"])
    try:
        c.start_master()
        c.start_node("a", list(tier_args(
            tmp_path / "a", blocks=64,
            extra=f",cluster_wait_ms={WAIT_MS},cluster_miss_ms=100")))
        c.agent("a", extra=tuple(agent_args))
        c.wait_joined("a")
        yield c
    finally:
        print(f"--- agent a: {c.stats('a')}\n{c.log('agent-a', 1500)}")
        c.close()


@pytest.fixture
def hits_node(tmp_path):
    """One node whose agent puts only blocks hit once (--write-behind hits:1)."""
    yield from _one_node(tmp_path, ("--write-behind", "hits:1"))


def test_hits_policy_puts_a_block_once_an_engine_hit_it(model_dir, hits_node):
    """--write-behind hits:1: a prefill's blocks stay on the node (the
    agent looks at each once a second, its own looks counting nothing)
    until another request's lookups hit them; then they are put."""
    a = Engine(model_dir, hits_node.urls["a"][0], "engine-a")
    hashes = prefill(a, PROMPT)
    time.sleep(2.5)  # two of the agent's looks at each committed block
    st = hits_node.stats("a")
    assert st["put"] == 0 and st["waiting_hits"] >= len(hashes), st
    a2 = Engine(model_dir, hits_node.urls["a"][0], "engine-a2")
    first, _ = a2.serve(a2.add(PROMPT))
    assert first == len(PROMPT) - 4 * BS  # a hit on the node's region
    st = hits_node.wait_stats("a", "put", len(hashes))
    assert st["put_errors"] == 0 and st["cold"] == 0
    for e in (a, a2):
        e.close()


@pytest.fixture
def pinned_node(tmp_path):
    """One node whose agent puts only a pinned prompt's blocks
    (--write-behind pinned --pin-file)."""
    pins = tmp_path / "pins.jsonl"
    pins.write_text("# the system prompt\n" + json.dumps(PROMPT) + "\n")
    seed = os.environ.get("PYTHONHASHSEED")
    yield from _one_node(tmp_path, ("--write-behind", "pinned", "--pin-file", str(pins),
                                    "--audit-s", "7",
                                    *(("--pin-hash-seed", seed) if seed else ())))


def test_pinned_prefixes_are_put_and_nothing_else(model_dir, pinned_node):
    """--write-behind pinned: the pin file's prompt (its keys computed by the
    agent from token ids, as vLLM's offloading scheduler makes them) is put,
    soft-pinned, as soon as an engine stores it; another prompt is not. When
    the store loses them, the agent's audit (--audit-s 7: longer than the
    store's 5 s lease, which its look renews) retracts them from the node's
    events with no engine asking."""
    assert pinned_node.wait_stats("a", "pinned", 4)["pinned"] == 4
    sub = kvpool.Subscriber(pinned_node.urls["a"][1], pinned_node.urls["a"][0],
                            pools=["tier"], index=False, int_hashes=False, timeout_ms=2000)
    a = Engine(model_dir, pinned_node.urls["a"][0], "engine-a")
    try:
        other = list(range(5000, 5000 + 4 * BS + 3))
        prefill(a, other)
        hashes = prefill(a, PROMPT)
        st = pinned_node.wait_stats("a", "pinned_put", len(hashes))
        keys = [h + b"\0\0\0\0" for h in hashes]
        _cluster_events({"a": sub}, {"stored": keys})  # from the log, after the puts
        time.sleep(1.0)  # time for a wrongly queued put of the other prompt
        st = pinned_node.stats("a")
        assert st["put"] == st["pinned_put"] == 4 and st["put_errors"] == 0, st
        _lose_blocks(pinned_node, len(keys))
        _cluster_events({"a": sub}, {"removed": keys}, timeout=30)
        assert pinned_node.wait_stats("a", "evicted", 4)["evicted"] >= 4
    finally:
        sub.close()
        a.close()
