#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""A consumer of vLLM's KV event wire that kvpool did not shape: Debian's
pyzmq and msgpack, decoding the way llm-d and Dynamo do (the batch an array
[ts, events, dp_rank]; events maps with "type" or arrays led by the class
name; hashes as ints), indexing only full-attention groups, counting blocks
per (group, hash), and repairing seq gaps through the replay socket.

Driven by tests/test_vllm_events.c over stdin/stdout, one command a line:
  pause          close the SUB socket (batches published meanwhile are missed)
  drop           keep the socket but discard what arrives (a connecting PUB
                 queues for an absent bound SUB, so closing loses nothing there)
  resume         open it again
  expect N       make sure seqs 0..N-1 were applied (replaying what is
                 missing), print every event and the index, then exit
Output lines: ready | paused | resumed | event ... | entry G H COUNT |
stats ... | error TEXT | done.
"""
import argparse
import sys

import msgpack
import zmq

FULL_KINDS = {"full_attention", "mla_attention", "sink_full_attention"}
STORED_FIELDS = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                 "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                 "kv_cache_spec_sliding_window", "locality", "ownership", "session_id",
                 "lookahead_token_ids"]
REMOVED_FIELDS = ["block_hashes", "medium", "group_idx", "locality"]
END_SEQ = b"\xff" * 8


def say(*words):
    print(*words, flush=True)


def as_dict(ev):
    """An event as a dict, from either form (consumers accept both)."""
    if isinstance(ev, dict):
        return ev
    name, rest = ev[0], ev[1:]
    fields = STORED_FIELDS if name == "BlockStored" else REMOVED_FIELDS
    d = {"type": name}
    d.update(zip(fields, rest))  # extra trailing elements are ignored
    return d


class Consumer:
    def __init__(self, args):
        self.a = args
        self.ctx = zmq.Context()
        self.last = -1
        self.index = {}          # (group, hash) -> blocks
        self.kinds = {}          # group -> kind seen on its BlockStored
        self.events = []
        self.gaps = self.replays = self.batches = 0
        self.sub = None
        self.dropping = False
        self.open_sub()
        self.rep = self.ctx.socket(zmq.DEALER)
        self.rep.setsockopt(zmq.LINGER, 0)
        self.rep.connect(args.replay)

    def open_sub(self):
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"kv@")  # llm-d's filter
        if self.a.bind:
            self.sub.bind(self.a.sub)
        else:
            self.sub.connect(self.a.sub)

    def full(self, group, kind):
        if kind is not None:
            return kind in FULL_KINDS
        return group == 0 or self.kinds.get(group) in FULL_KINDS  # Dynamo: no kind, group 0

    def apply(self, seq, payload):
        ts, events, rank = msgpack.unpackb(payload, raw=False)[:3]
        if rank != self.a.rank or not isinstance(ts, float):
            say("error", "batch", seq, "has dp_rank", rank, "ts", type(ts).__name__)
        for raw in events:
            ev = as_dict(raw)
            t = ev["type"]
            if t == "AllBlocksCleared":
                self.index.clear()
                self.events.append("C")
                continue
            hashes = ev["block_hashes"]
            if not all(isinstance(h, int) for h in hashes):
                say("error", "hashes are not ints")
            group = ev.get("group_idx")
            tag = "S" if t == "BlockStored" else "R"
            self.events.append("%s %s %s" % (tag, group, ",".join(str(h) for h in hashes)))
            if t == "BlockStored":
                kind = ev.get("kv_cache_spec_kind")
                self.kinds[group] = kind
                if len(ev["token_ids"]) != len(hashes) * ev["block_size"]:
                    say("error", "BlockStored token_ids do not cover its blocks")
                if not self.full(group, kind):
                    continue
                for h in hashes:
                    self.index[(group, h)] = self.index.get((group, h), 0) + 1
            else:
                if not self.full(group, None):
                    continue
                for h in hashes:
                    n = self.index.get((group, h), 0) - 1
                    if n < 0:
                        say("error", "BlockRemoved of an unknown hash", h)
                    if n <= 0:
                        self.index.pop((group, h), None)
                    else:
                        self.index[(group, h)] = n
        self.last = seq
        self.batches += 1

    def replay_from(self, start):
        """Every buffered batch from start on, then the end marker."""
        self.replays += 1
        req = [start.to_bytes(8, "big")]
        self.rep.send_multipart([b""] + req if self.a.delim else req)
        while True:
            if not self.rep.poll(5000):
                say("error", "replay from", start, "got no end marker")
                return
            frames = self.rep.recv_multipart()
            if self.a.delim:
                if frames[0] != b"":
                    say("error", "replay reply without the delimiter")
                frames = frames[1:]
            if self.a.replay_topic:
                if frames[0] != self.a.topic.encode():
                    say("error", "replay topic", frames[0])
                frames = frames[1:]
            if len(frames) != 2:
                say("error", "replay reply of", len(frames), "frames")
                return
            seqb, payload = frames
            if seqb == END_SEQ or payload == b"":
                return
            seq = int.from_bytes(seqb, "big")
            if seq == self.last + 1:
                self.apply(seq, payload)

    def on_message(self):
        topic, seqb, payload = self.sub.recv_multipart()
        if self.dropping:
            return
        if topic != self.a.topic.encode():
            say("error", "topic", topic)
        seq = int.from_bytes(seqb, "big")
        if seq <= self.last:
            return
        if seq > self.last + 1:
            self.gaps += 1
            self.replay_from(self.last + 1)
        if seq == self.last + 1:
            self.apply(seq, payload)

    def finish(self, n):
        for _ in range(5):
            if self.last >= n - 1:
                break
            self.replay_from(self.last + 1)
        if self.last != n - 1:
            say("error", "applied up to", self.last, "of", n)
        for e in self.events:
            say("event", e)
        for (g, h), c in sorted(self.index.items()):
            say("entry", g, h, c)
        say("stats", "gaps", self.gaps, "replays", self.replays, "batches", self.batches)
        say("done")

    def run(self):
        poller = zmq.Poller()
        poller.register(self.sub, zmq.POLLIN)
        poller.register(sys.stdin.fileno(), zmq.POLLIN)
        say("ready")
        while True:
            ready = dict(poller.poll(10000))
            if not ready:
                say("error", "nothing for 10 s")
                return 1
            if self.sub in ready:
                self.on_message()
            if sys.stdin.fileno() in ready:
                words = sys.stdin.readline().split()
                if not words:
                    return 1
                if words[0] == "pause":
                    poller.unregister(self.sub)
                    self.sub.close()
                    say("paused")
                elif words[0] == "drop":
                    self.dropping = True
                    say("dropping")
                elif words[0] == "resume":
                    if self.dropping:
                        self.dropping = False
                    else:
                        self.open_sub()
                        poller.register(self.sub, zmq.POLLIN)
                    say("resumed")
                elif words[0] == "expect":
                    self.finish(int(words[1]))
                    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sub", required=True)
    ap.add_argument("--bind", action="store_true", help="bind the SUB (centralised mode)")
    ap.add_argument("--replay", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--replay-topic", type=int, default=1)
    ap.add_argument("--delim", type=int, default=1, help="REQ-style empty delimiter")
    return Consumer(ap.parse_args()).run()


if __name__ == "__main__":
    sys.exit(main())
