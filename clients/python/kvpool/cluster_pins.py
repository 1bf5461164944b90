# SPDX-License-Identifier: Apache-2.0
"""Pinned prefixes for the cluster tier (docs/cluster.md, "Pinned
prefixes"): an operator's list of prompts whose blocks every node puts into
the store as soon as it holds them, whatever the write-behind policy, and
puts soft-pinned (Mooncake evicts them last).

The file has one prompt a line, as JSON: a list of token ids, or an object
{"tokens": [...], "lora_name": ..., "lora_path": ..., "cache_salt": ...}
(vLLM's extra keys; a LoRA needs its path, as vLLM 0.33 hashes it). Blank
lines and lines starting with # are skipped. Each prompt's offload keys are
vLLM 0.33's: the block hashes of its full blocks (tokens_per_hash tokens
each, with the engines' hash algorithm and seed), one key per chunk of
hashes_per_chunk of them (the chunk's last hash), for each group given.
"""
from __future__ import annotations

import json
import time
from collections import deque
from typing import Iterable, Optional

from kvpool.client import Hasher
from kvpool.region import offload_key

MAX_PINNED_KEYS = 65536  # keys a pin file may name, at most

__all__ = ["MAX_PINNED_KEYS", "PinSet", "load_pins", "prompt_keys"]


def prompt_keys(hasher: Hasher, tokens: list[int], tokens_per_hash: int, hashes_per_chunk: int,
                groups: Iterable[int], lora_name: Optional[str] = None,
                lora_path: Optional[str] = None,
                cache_salt: Optional[str] = None) -> list[bytes]:
    """The offload keys of one prompt's full chunks, as vLLM's offloading
    scheduler makes them (the hash at each chunk's last block)."""
    hashes = hasher.hash_request(tokens, tokens_per_hash, lora_name=lora_name,
                                 lora_path=lora_path, cache_salt=cache_salt)
    last = [hashes[i] for i in range(hashes_per_chunk - 1, len(hashes), hashes_per_chunk)]
    return [offload_key(h, g) for g in groups for h in last]


def load_pins(path: str, hasher: Hasher, tokens_per_hash: int, hashes_per_chunk: int,
              groups: Iterable[int], limit: int = MAX_PINNED_KEYS) -> list[bytes]:
    """Every pinned key of the file, in its order, each once. ValueError
    naming the line for a line that is not a prompt, or past limit keys."""
    if tokens_per_hash < 1 or hashes_per_chunk < 1:
        raise ValueError(f"kvpool cluster: {tokens_per_hash} tokens a hash and "
                         f"{hashes_per_chunk} hashes a chunk: both must be 1 or more")
    groups = list(groups)
    keys: dict[bytes, None] = {}
    with open(path, encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            where = f"{path}:{no}"
            try:
                item = json.loads(line)
            except ValueError as e:
                raise ValueError(f"kvpool cluster: {where}: not JSON ({e})") from None
            extra: dict[str, str] = {}
            if isinstance(item, dict):
                unknown = sorted(set(item) - {"tokens", "lora_name", "lora_path", "cache_salt"})
                if unknown:
                    raise ValueError(f"kvpool cluster: {where}: unknown fields {unknown}")
                extra = {k: v for k, v in item.items() if k != "tokens"}
                if not all(isinstance(v, str) for v in extra.values()):
                    raise ValueError(f"kvpool cluster: {where}: lora_name, lora_path and "
                                     "cache_salt are strings")
                item = item.get("tokens")
            if (not isinstance(item, list) or not item or
                    not all(type(t) is int and 0 <= t < 1 << 32 for t in item)):
                raise ValueError(f"kvpool cluster: {where}: a prompt is a non-empty list of "
                                 "token ids (0 to 2^32 - 1), or an object with one in tokens")
            for k in prompt_keys(hasher, item, tokens_per_hash, hashes_per_chunk, groups,
                                 **extra):
                keys[k] = None
            if len(keys) > limit:
                raise ValueError(f"kvpool cluster: {where}: more than {limit} pinned keys")
    return list(keys)


class PinSet:
    """The pinned keys, and which of them the agent should put now."""

    def __init__(self, keys: list[bytes], sweep_s: float = 10.0, per_sweep: int = 1024) -> None:
        self.keys = keys
        self._set = frozenset(keys)
        self.sweep_s, self.per_sweep = sweep_s, per_sweep
        self._at, self._next = 0, 0.0

    def __len__(self) -> int:
        return len(self.keys)

    def __contains__(self, k: object) -> bool:
        return k in self._set

    def due(self, todo: deque[bytes]) -> tuple[list[bytes], deque[bytes]]:
        """(the keys to put now, todo without them): the pinned keys of
        todo (committed rows), and every sweep_s the next per_sweep pinned
        keys in turn, which the caller puts if it holds their rows and the
        store does not have them (committed before the agent started, or
        lost by the store)."""
        keys = [k for k in todo if k in self._set]
        if keys:
            todo = deque(k for k in todo if k not in self._set)
        now = time.monotonic()
        if self.keys and now >= self._next:
            self._next = now + self.sweep_s
            n = min(self.per_sweep, len(self.keys))
            keys += [self.keys[(self._at + i) % len(self.keys)] for i in range(n)]
            self._at = (self._at + n) % len(self.keys)
        return list(dict.fromkeys(keys)), todo
