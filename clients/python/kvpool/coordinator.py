# SPDX-License-Identifier: Apache-2.0
"""RemoteKVCacheManager.coordinator: the part of vLLM's KVCacheCoordinator
that vLLM 0.33's Scheduler reads from outside the manager (its per-group
managers' block sizes and specs, whether partial hash hits are on, and the
blocks a request would need), answered from the adapter's mirror of the
request's blocks. Read-only: the daemon decides every allocation."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

if TYPE_CHECKING:
    from .manager import RemoteKVCacheManager
    from .block_pool import KVCacheBlock


def _vllm_spec(group: dict) -> Optional[Any]:
    """vLLM's KVCacheSpec class for a kvpool group, when vLLM is installed
    (the Scheduler tests isinstance against them), else None."""
    try:
        from vllm.v1 import kv_cache_interface as kci
    except ImportError:
        return None
    return {"full_attention": getattr(kci, "FullAttentionSpec", None),
            "sliding_window": getattr(kci, "SlidingWindowSpec", None),
            "chunked_local_attention": getattr(kci, "ChunkedLocalAttentionSpec", None),
            "mamba": getattr(kci, "MambaSpec", None)}.get(group["kind"])


class _SpecKind:
    """Stands for a group's vLLM spec: isinstance() against vLLM's spec
    classes answers as the group's kind would, without vLLM's dtype and
    shape fields, which a kvpool pool does not have."""

    def __init__(self, group: dict):
        self.block_size = group["block_size"]
        self.sliding_window = group.get("sliding_window")
        self.attention_chunk_size = group.get("attention_chunk_size")
        cls = _vllm_spec(group)
        if cls is not None:
            self.__class__ = type(f"Remote{cls.__name__}", (_SpecKind, cls), {})


class GroupView:
    """vLLM's SingleTypeKVCacheManager as the Scheduler reads it: block_size,
    kv_cache_spec, and req_to_blocks / num_cached_block from the mirror."""

    def __init__(self, mgr: RemoteKVCacheManager, g: int):
        self._mgr, self.kv_cache_group_id = mgr, g
        self.block_size = mgr.groups[g]["block_size"]
        self.kv_cache_spec = _SpecKind(mgr.groups[g])
        # (source, copy) block pairs for the workers, as vLLM 0.33's
        # manager queues them; this adapter makes no partial entries, so
        # only a caller queues any (vLLM's tests do).
        self._pending_cow_copies: list[tuple[KVCacheBlock, KVCacheBlock]] = []

    def take_pending_cow_copies(self) -> list[tuple[KVCacheBlock, KVCacheBlock]]:
        """Drain the queued copy-on-write pairs, as vLLM 0.33's does."""
        pending, self._pending_cow_copies = self._pending_cow_copies, []
        return pending

    @property
    def _null_block(self) -> KVCacheBlock:
        """The null block that stands where a group dropped blocks (vLLM's
        manager's private member, which vLLM's own tests read)."""
        return self._mgr.null_block

    @property
    def req_to_blocks(self) -> dict[Any, list[KVCacheBlock]]:
        return {rid: list(r.blocks[self.kv_cache_group_id])
                for rid, r in self._mgr._reqs.items() if r.blocks}

    @property
    def num_cached_block(self) -> dict[Any, int]:
        return {rid: r.cached // self.block_size for rid, r in self._mgr._reqs.items()
                if r.blocks}


class RemoteCoordinator:
    """vLLM 0.33's KVCacheCoordinator as its Scheduler reads it."""

    enable_partial_hash_hits = False  # kvpool's request manager makes no partial entries

    def __init__(self, mgr: RemoteKVCacheManager):
        self._mgr = mgr
        self.single_type_managers = [GroupView(mgr, g) for g in range(len(mgr.groups))]

    def get_num_blocks_to_allocate(self, request_id: Any, num_tokens: int,
                                   new_computed_blocks: Sequence[Sequence[KVCacheBlock]],
                                   num_encoder_tokens: int = 0, total_computed_tokens: int = 0,
                                   num_local_computed_tokens: int = 0,
                                   num_tokens_main_model: int = 0,
                                   apply_admission_cap: bool = False,
                                   prefill_end: int = 0) -> int:
        """The blocks the request needs for num_tokens, vLLM's full-attention
        rule per group: its missing blocks, plus each evictable hit it would
        take from the free queue. Sparse groups (sliding window,
        chunked-local, Mamba) are counted as full attention: an upper
        bound, where vLLM's skips the blocks outside the window; a
        cross-attention group needs num_encoder_tokens' blocks."""
        req = self._mgr._reqs.get(request_id)
        total = 0
        for g, view in enumerate(self.single_type_managers):
            cross = self._mgr.groups[g]["kind"] == "cross_attention"  # encoder tokens, once
            need = -(-(num_encoder_tokens if cross else num_tokens) // view.block_size)
            held = len(req.blocks[g]) if req is not None and req.blocks else 0
            hits = list(new_computed_blocks[g]) if g < len(new_computed_blocks) else []
            if held:
                total += max(need - held, 0)
                continue
            total += max(need - len(hits), 0)
            total += sum(1 for b in hits if b.ref_cnt == 0 and not b.is_null)
        return total

    def pop_blocks_for_free(self, request_id: Any) -> list[KVCacheBlock]:
        return self._mgr._pop_blocks(request_id)


def _skipped_blocks(spec, num_computed):
    """get_num_skipped_tokens(num_computed) // block_size: a window's or a
    chunk's tokens before it, a Mamba group's before the last token."""
    bs = spec["block_size"]
    if spec["kind"] == "mamba":
        return max(num_computed - 1, 0) // bs
    if spec["kind"] == "sliding_window":
        return max(0, num_computed - spec["sliding_window"] + 1) // bs
    if spec["kind"] == "chunked_local_attention":
        chunk = spec["attention_chunk_size"]
        return (num_computed // chunk * chunk) // bs
    return 0


def drop_skipped(req, groups, num_computed, null_block):
    """vLLM's remove_skipped_blocks on a request's mirror (a manager's _Req):
    blocks that left a sliding window or a finished local chunk become the
    null block, as do a Mamba group's states before the last computed token,
    and in align mode the state block of two steps ago; each drops the
    reference the request held."""
    def to_null(row, i):
        row[i].ref_cnt -= 1
        row[i] = null_block
    for g, spec in enumerate(groups):
        if spec["kind"] == "full_attention":
            continue
        skipped = _skipped_blocks(spec, num_computed)
        row = req.blocks[g]
        for i in range(min(skipped, len(row)) - 1, -1, -1):
            if row[i].is_null:
                break
            to_null(row, i)
        idx = req.last_state[g]
        if (idx is not None and num_computed > 0 and idx + 1 < -(-num_computed //
                                                                spec["block_size"])
                and idx < len(row) and not row[idx].is_null):
            to_null(row, idx)


def note_state(req, groups, g):
    """Before group g's table grows: in Mamba align mode the running state
    of the previous step (or the hit's) is its last block."""
    if groups[g].get("mamba_cache_mode") == "align":
        prev = len(req.blocks[g])
        if req.allocated[g] or prev > 0:
            req.last_state[g] = prev - 1
        req.allocated[g] = True
