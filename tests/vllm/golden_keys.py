#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Prints tests/test_block_hash.c's tagged_vectors table from the installed
vLLM 0.33's own request block hasher (PYTHONHASHSEED=0, every hash
algorithm): vLLM's tagged extra keys (LoRA name and path, cache salt,
multimodal features) for the cases that test names. Each case hashes its
first tokens, then all of them from the hashes so far, as vLLM extends a
request. Run it with the vLLM environment's python to regenerate them:
    "$(sh tests/vllm/env.sh)/bin/python" tests/vllm/golden_keys.py
"""
import os

os.environ["PYTHONHASHSEED"] = "0"

from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.multimodal.inputs import PlaceholderRange  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core import kv_cache_utils  # noqa: E402


class Feature:
    """A MultiModalFeatureSpec as vLLM's hasher reads it."""

    def __init__(self, identifier, offset, length):
        self.identifier = identifier
        self.mm_position = PlaceholderRange(offset=offset, length=length)


class Request:
    """A vLLM Request as vLLM's hasher reads it."""

    def __init__(self, num_tokens, lora=None, mm=(), salt=None):
        self.all_token_ids = list(range(num_tokens))
        self.num_tokens = num_tokens
        self.block_hashes = []
        self.lora_request = LoRARequest(lora[0], 1, lora[1]) if lora else None
        self.mm_features = [Feature(*m) for m in mm]
        self.cache_salt = salt
        self.prompt_embeds = None
        self._prompt_embeds_per_block_hashes = {}


# name, keys, block size, tokens hashed first, tokens in all (test_block_hash.c's cases)
CASES = [("LORA", dict(lora=("L", "/adapters/L")), 4, 8, 8),
         ("SALT", dict(salt="S"), 4, 8, 8),
         ("ALL", dict(lora=("L", "/p"), mm=[("img", 2, 3)], salt="S"), 4, 8, 8),
         ("MM2", dict(mm=[("aaa", 0, 1), ("bbb", 2, 1)]), 4, 8, 8),
         ("WINDOW", dict(mm=[("a", 2, 8), ("b", 10, 2)]), 4, 8, 16),
         ("EDGE", dict(mm=[("img", 8, 8)]), 8, 8, 24)]
ALGOS = {"sha256_cbor": "KVP_HASH_SHA256_CBOR", "sha256": "KVP_HASH_SHA256",
         "xxhash": "KVP_HASH_XXHASH", "xxhash_cbor": "KVP_HASH_XXHASH_CBOR"}


def main():
    for algo, c_name in ALGOS.items():
        fn = get_hash_fn_by_name(algo)
        kv_cache_utils.init_none_hash(fn)
        for name, keys, block_size, first, total in CASES:
            req = Request(first, **keys)
            hasher = kv_cache_utils.get_request_block_hasher(block_size, fn)
            req.block_hashes = hasher(req)
            req.all_token_ids = list(range(total))
            req.num_tokens = total
            req.block_hashes += hasher(req)
            print('\t{%s, %s, "%s"},' % (c_name, name, "".join(h.hex() for h in req.block_hashes)))


if __name__ == "__main__":
    main()
