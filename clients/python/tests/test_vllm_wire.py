# SPDX-License-Identifier: Apache-2.0
"""vLLM's ZMQ event wire across a daemon restart, as llm-d sees it: one SUB
socket that stays connected while kvpoold stops and starts again on the same
endpoint. vLLM's publisher counts seq from 0 per process, and a seq that goes
back to 0 is how llm-d tells a restart from a gap; kvpool's must do the same."""
import struct
import time

import msgpack
import pytest
import zmq

import kvpool

from conftest import start, stop


def _stored_batch(url, k):
    """Caches one new block (a fresh pool hands out blocks never cached, so
    nothing is evicted): exactly one batch, holding one BlockStored."""
    with kvpool.Client(url, pool="w") as c:
        ids = c.allocate(1)
        c.cache(ids, range(4 * k, 4 * k + 4), 1)
        c.free(ids)


def _next_seqs(sock, n, timeout_s=10):
    seqs, deadline = [], time.monotonic() + timeout_s
    while len(seqs) < n and time.monotonic() < deadline:
        if sock.poll(100):
            _topic, seq, payload = sock.recv_multipart()
            _ts, events, _rank = msgpack.unpackb(payload)
            assert events, "a batch with no events was published"
            seqs.append(struct.unpack(">q", seq)[0])
    return seqs


def test_a_restarted_daemon_counts_seq_from_zero_again(tmp_path):
    wire = f"ipc://{tmp_path}/vllm.ipc"
    args = ("--vllm-events", wire, "--pool", "name=w,blocks=64,block_size=4,executor=none")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(wire)
    proc = None
    try:
        proc, url, _ = start(tmp_path, *args, pool="w")
        time.sleep(0.3)  # the subscription reaches the publisher
        for k in range(3):
            _stored_batch(url, k)
        before = _next_seqs(sock, 3)
        assert before == [0, 1, 2], before
        stop(proc)
        proc, url, _ = start(tmp_path, *args, pool="w")
        # The SUB socket reconnects by itself, at a time of its own: batches
        # published before it is back are missed, as any subscriber misses
        # them. The first one it receives must carry the count of batches
        # the new process published before it: seq restarted at 0.
        for k in range(20):
            _stored_batch(url, k)
            got = _next_seqs(sock, 1, timeout_s=0.3)
            if got:
                assert got == [k], (k, got)
                break
        else:
            raise AssertionError("no batch reached the subscriber after the restart")
    finally:
        if proc is not None and proc.poll() is None:
            stop(proc)
        sock.close(0)
        ctx.term()


def _replay(ctx, endpoint, from_seq=0, timeout_s=5):
    """vLLM's replay request from a DEALER: every reply's frames, up to the end marker."""
    s = ctx.socket(zmq.DEALER)
    s.connect(endpoint)
    try:
        s.send(struct.pack(">q", from_seq))
        replies, deadline = [], time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if s.poll(100):
                frames = s.recv_multipart()
                replies.append(frames)
                if frames[-2] == struct.pack(">q", -1):
                    return replies
        raise AssertionError(f"no end marker from {endpoint}: {replies}")
    finally:
        s.close(0)


def test_one_daemon_replays_for_llmd_and_dynamo(tmp_path):
    """vllm-replay's replies carry the topic frame (llm-d), vllm-replay-plain's
    do not (Dynamo's listener): the same batches from one daemon."""
    wire, topic_ep, plain_ep = (f"ipc://{tmp_path}/{n}.ipc" for n in ("v", "r", "p"))
    args = ("--vllm-events", wire, "--vllm-replay", topic_ep, "--vllm-replay-plain", plain_ep,
            "--vllm-topic", "kv@pod@{model}",
            "--pool", "name=w,blocks=64,block_size=4,executor=none")
    proc, url, _ = start(tmp_path, *args, pool="w")
    ctx = zmq.Context()
    try:
        for k in range(2):
            _stored_batch(url, k)
        with_topic = _replay(ctx, topic_ep)
        plain = _replay(ctx, plain_ep)
        assert [len(f) for f in with_topic] == [3, 3, 3]
        assert all(f[0] == b"kv@pod@w" for f in with_topic)
        assert [len(f) for f in plain] == [2, 2, 2]
        assert [f[1:] for f in with_topic] == plain
        assert [struct.unpack(">q", f[0])[0] for f in plain] == [0, 1, -1]
        assert msgpack.unpackb(plain[0][1])[1], "the replayed batch has its events"
    finally:
        stop(proc)
        ctx.term()


def _topics(sock, timeout_s=3):
    """(topic, seq) of every message that arrives within timeout_s of the last."""
    out, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sock.poll(100):
            topic, seq, _payload = sock.recv_multipart()
            out.append((topic.decode(), struct.unpack(">q", seq)[0]))
            deadline = time.monotonic() + 0.5
    return out


def test_a_tier_credits_its_engine_pods(tmp_path):
    """A session that serves an engine pod (vLLM's offload tier) has the pool's
    batches also published under that pod's topic, same seq, while it lives."""
    wire = f"ipc://{tmp_path}/vllm.ipc"
    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(wire)
    proc, url, _ = start(tmp_path, "--vllm-events", wire, "--vllm-pod", "kvpool-node",
                         "--region-dir", str(tmp_path),
                         "--pool", "name=tier,blocks=16,block_size=16,executor=cpu", pool="tier")
    try:
        time.sleep(0.3)
        key = lambda i: kvpool.offload_key(bytes([i]) * 32, 0)  # noqa: E731
        with kvpool.Client(url, pool="tier", vllm_pod="10.1.2.3") as a, \
                kvpool.Client(url, pool="tier", vllm_pod="10.1.2.4") as b:
            a.reserve([key(1)])
            a.commit([key(1)])
            got = _topics(sock)
            assert sorted(got) == [("kv@10.1.2.3@tier", 0), ("kv@10.1.2.4@tier", 0),
                                   ("kv@kvpool-node@tier", 0)], got
            b.close()
            a.reserve([key(2)])
            a.commit([key(2)])
            assert sorted(_topics(sock)) == [("kv@10.1.2.3@tier", 1), ("kv@kvpool-node@tier", 1)]
            with pytest.raises(kvpool.InvalidArgument):
                kvpool.Client(url, pool="tier", vllm_pod="bad@pod")
        # every pod's session gone: the pool's own topic only
        with kvpool.Client(url, pool="tier") as c:
            c.reserve([key(3)])
            c.commit([key(3)])
        assert _topics(sock) == [("kv@kvpool-node@tier", 2)]
    finally:
        stop(proc)
        sock.close(0)
        ctx.term()


def _rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_replay_output_is_bounded_per_peer_and_in_total(tmp_path):
    """Eight peers that ask for the whole replay ten times each and read
    nothing make the daemon hold about vllm-replay-total-mib more (at most
    twice it), not eighty copies of the ring; an honest peer meanwhile gets
    every batch, paced by its own reading, and the end marker."""
    wire, rep = f"ipc://{tmp_path}/v.ipc", f"tcp://127.0.0.1:{_free_port()}"
    proc, url, _ = start(tmp_path, "--vllm-events", wire, "--vllm-replay", rep,
                         "--vllm-buffer-mib", "64", "--vllm-replay-peer-mib", "1",
                         "--vllm-replay-total-mib", "4",
                         "--pool", "name=w,blocks=1024,block_size=16,executor=none", pool="w")
    ctx = zmq.Context()
    greedy = []
    try:
        # About 24 MB of BlockStored batches: 1,000 blocks of 16 tokens each time.
        n_batches = 0
        with kvpool.Client(url, pool="w") as c:
            for k in range(48):
                ids = c.allocate(1000)
                c.cache(ids, range(k * 16000, (k + 1) * 16000), 1000)
                c.free(ids)
                n_batches += 1
        base = _rss_mib(proc.pid)
        for _ in range(8):  # eight peers, ten requests each, reading nothing
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.RCVHWM, 1)
            s.setsockopt(zmq.RCVBUF, 4096)
            s.connect(rep)
            for _ in range(10):
                s.send(struct.pack(">q", 0))
            greedy.append(s)
        time.sleep(3)
        grown = _rss_mib(proc.pid) - base
        assert grown < 48, f"daemon grew {grown:.0f} MiB for peers that read nothing"
        # An honest peer gets everything, though the others hold the budget.
        got = _replay(ctx, rep, timeout_s=60)
        seqs = [struct.unpack(">q", f[-2])[0] for f in got]
        assert seqs[-1] == -1 and len(seqs) - 1 >= n_batches - 1, seqs[-3:]
    finally:
        for s in greedy:
            s.close(0)
        stop(proc)
        ctx.term()


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_subscribers_that_never_read_hold_at_most_the_queue_budget(tmp_path):
    """Ten subscribers that never read: libzmq would keep every batch for
    them (up to vllm-hwm messages each); past vllm-queue-mib the publisher
    is opened again and their queues go, so the daemon holds about the
    budget, not what was published. A subscriber that reads gets the later
    batches after it reconnects."""
    port = _free_port()
    wire = f"tcp://127.0.0.1:{port}"  # vLLM's rule: the daemon binds tcp://*, connects otherwise
    proc, url, _ = start(tmp_path, "--vllm-events", f"tcp://*:{port}", "--vllm-queue-mib", "4",
                         "--replay-mib", "1",  # the native ring, not what this measures
                         "--pool", "name=w,blocks=1024,block_size=16,executor=none", pool="w")
    ctx = zmq.Context()
    subs, honest = [], None
    try:
        for _ in range(10):
            s = ctx.socket(zmq.SUB)
            s.setsockopt(zmq.RCVHWM, 1)
            s.setsockopt(zmq.RCVBUF, 4096)
            s.setsockopt(zmq.SUBSCRIBE, b"")
            s.connect(wire)
            subs.append(s)
        honest = ctx.socket(zmq.SUB)
        honest.setsockopt(zmq.SUBSCRIBE, b"")
        honest.connect(wire)
        time.sleep(0.5)  # the subscriptions reach the publisher
        base = _rss_mib(proc.pid)
        with kvpool.Client(url, pool="w") as c:
            for k in range(384):  # about 190 MB of batches
                ids = c.allocate(1000)
                c.cache(ids, range(k * 16000, (k + 1) * 16000), 1000)
                c.free(ids)
                while honest.poll(0):
                    honest.recv_multipart()
        grown = _rss_mib(proc.pid) - base
        assert grown < 24, f"daemon grew {grown:.0f} MiB holding batches nobody read"
        # The honest subscriber still hears new batches after the resets.
        deadline, heard, k = time.monotonic() + 5, False, 0
        with kvpool.Client(url, pool="w") as c:
            while not heard and time.monotonic() < deadline:
                ids = c.allocate(1)
                c.cache(ids, range(10**7 + 16 * k, 10**7 + 16 * (k + 1)), 1)
                c.free(ids)
                k += 1
                heard = honest.poll(200) != 0
        assert heard, "a reading subscriber heard nothing after the publisher was reopened"
    finally:
        for s in subs + ([honest] if honest is not None else []):
            s.close(0)
        stop(proc)
        ctx.term()
