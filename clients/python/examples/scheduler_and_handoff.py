# SPDX-License-Identifier: Apache-2.0
"""A tiny scheduler loop sharing a prefix across requests, a step that
admits four more with their prefix hits looked up in one round trip, then
a prefill-to-decode handoff of block contents from NumPy arrays.

    python3 clients/python/examples/scheduler_and_handoff.py ipc:///tmp/kvpool.ipc [POOL]

The pool must hash as a default vLLM 0.33 does (no seed in its --pool
spec: NONE_HASH from vLLM's fixed seed), so the hashes Python computes are
the daemon's. With an executor (host memory by
default) the handoff runs too."""
import sys

import numpy as np

import kvpool
from kvpool.vllm import RemoteKVCacheManager


class Request:
    """The parts of vLLM's Request that RemoteKVCacheManager reads."""

    def __init__(self, request_id, tokens, hasher, block_size):
        self.request_id = request_id
        self.all_token_ids = list(tokens)
        self.block_hashes = hasher.hash_request(tokens, block_size)
        self.lora_request = self.cache_salt = self.mm_features = None

    @property
    def num_tokens(self):
        return len(self.all_token_ids)


def main(url, pool="default"):
    with kvpool.Client(url, pool=pool) as c:
        bs = c.info["block_size"]
        hasher = kvpool.Hasher(kvpool.Hasher.DEFAULT_SEED, algorithm=c.info["hash_algorithm"])
        mgr = RemoteKVCacheManager(c)
        system = list(range(1000, 1000 + 4 * bs))  # a system prompt of 4 blocks
        reqs = [Request(f"req-{i}", system + [i] * bs, hasher, bs) for i in range(4)]
        # The scheduler's calls for each new request: the prefix hit, then slots.
        for r in reqs:
            try:
                hit_blocks, hit, _ = mgr.get_computed_blocks(r)
            except kvpool.NotSupported:  # a hybrid pool: the daemon takes the hit itself
                hit_blocks, hit = None, 0
            new = mgr.allocate_slots(r, r.num_tokens - hit, hit, hit_blocks)
            print(f"{r.request_id}: prefix hit {hit} tokens, new blocks "
                  f"{new.get_block_ids() if new else None}, table {mgr.get_block_ids(r.request_id)}")
        # Three decode steps, each one Batch for every running request.
        for step in range(3):
            with mgr.step() as s:
                for r in reqs:
                    r.all_token_ids.append(7)
                    s.allocate_slots(r, 1)
                s.commit()
        print(f"after 3 decode steps: usage {mgr.usage:.3f}")
        # Admitting several requests in one step: their prefix hits come from
        # one round trip (prefetch_computed_blocks), then one Step allocates.
        more = [Request(f"req-{i}", system + [i] * bs, hasher, bs) for i in range(4, 8)]
        try:
            mgr.prefetch_computed_blocks(more)
            hits = [mgr.get_computed_blocks(r)[:2] for r in more]
        except kvpool.NotSupported:  # a hybrid pool: the daemon takes the hit itself
            hits = [(None, 0)] * len(more)
        with mgr.step() as s:
            for r, (blocks, hit) in zip(more, hits):
                s.allocate_slots(r, r.num_tokens - hit, hit, blocks)
            got = s.commit()
        print(f"admitted {len(more)} in one step: prefix hits {[h for _, h in hits]} tokens, "
              f"new blocks {[g.get_block_ids() if g else None for g in got]}")
        reqs += more

        # Prefill-to-decode handoff through the prefix cache: the prefill side
        # takes blocks, writes their KV from NumPy and caches them under the
        # prompt's hashes; the decode side (another session) finds them by the
        # same tokens and reads them into its own array.
        ex = c.info["executor"]
        if ex is not None:
            prompt = list(range(5000, 5000 + 2 * bs))
            ids = c.allocate(2)
            kv = np.random.default_rng(0).integers(0, 255, size=2 * ex["block_bytes"],
                                                   dtype=np.uint8)
            c.write_blocks(ids, kv)
            c.cache(ids, prompt, 2)
            with kvpool.Client(url, pool=pool) as decode:
                found, hit = decode.lookup(prompt)
                decode.touch(found)  # a reference first: what it reads cannot be reused meanwhile
                out = np.empty_like(kv)
                decode.read_blocks(found, out)
                decode.free(found)
            assert found == ids and np.array_equal(out, kv)
            print(f"handed off blocks {ids} ({kv.nbytes} bytes) byte for byte")
            c.free(ids)
        for r in reqs:
            mgr.free(r)
        print(f"freed every request: {c.stats()['num_free']} blocks free")


if __name__ == "__main__":
    main(*sys.argv[1:])
