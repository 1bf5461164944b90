# SPDX-License-Identifier: Apache-2.0
"""Arguments into libkvpool's C types and the shapes of results, for every
module of the package: the bottom of its line (client, batch, events and
step import from here; this module imports none of them)."""
from __future__ import annotations

import array
import ctypes
from ctypes import c_int32, c_int64, c_uint8, c_void_p
from dataclasses import dataclass
from typing import Optional

from . import _lib as L
from .errors import BY_STATUS, KvpoolError


def _raise(rv, detail=""):
    name = L.kvp_status_wire_name(rv).decode()
    raise BY_STATUS.get(rv, KvpoolError)(rv, name, detail)


def _array(typecode, ctype, seq):
    """(a ctypes array over the values, count): one conversion through the
    array module, no per-item ctypes objects."""
    a = array.array(typecode, seq if seq is not None else ())
    n = len(a)
    if n == 0:
        return (ctype * 1)(), 0
    return (ctype * n).from_buffer(a), n


def _ids(seq):
    return _array("i", c_int32, seq)


def _tokens(seq):
    return _array("q", c_int64, seq)


def _hashes(hashes, width):
    """Concatenated hashes of width bytes each (the pool's hash_len: 32, or
    16 for the xxhash algorithms) as a uint8 array, and how many."""
    hashes = list(hashes)
    if any(len(h) != width for h in hashes):
        raise ValueError(f"kvpool: block hashes must be {width} bytes each (vLLM's BlockHash "
                         f"for this pool's hash algorithm)")
    raw = b"".join(hashes)
    return (c_uint8 * max(len(raw), 1)).from_buffer_copy(raw or b"\0"), len(hashes)


def _buffer(obj, writable):
    """(address, nbytes, keepalive) of a C-contiguous buffer, without a copy:
    bytes/bytearray/memoryview, anything with the buffer protocol, NumPy arrays,
    CPU torch tensors. A read-only buffer that is none of bytes, NumPy or torch
    is copied once (ctypes cannot take its address)."""
    if hasattr(obj, "data_ptr") and hasattr(obj, "element_size"):  # torch.Tensor
        if obj.device.type != "cpu" or not obj.is_contiguous():
            raise ValueError("kvpool: a torch tensor must be contiguous and on the CPU")
        return obj.data_ptr(), obj.numel() * obj.element_size(), obj
    if hasattr(obj, "__array_interface__"):  # NumPy (read-only ones too)
        ai = obj.__array_interface__
        if ai.get("strides") is not None:
            raise ValueError("kvpool: the array must be C-contiguous")
        if writable and ai["data"][1]:
            raise ValueError("kvpool: the array is read-only")
        return ai["data"][0], obj.nbytes, obj
    if isinstance(obj, bytes):
        if writable:
            raise TypeError("kvpool: bytes are read-only; pass a bytearray or an array")
        p = ctypes.c_char_p(obj)
        return ctypes.cast(p, c_void_p).value, len(obj), (obj, p)
    mv = memoryview(obj)
    if not mv.c_contiguous:
        raise ValueError("kvpool: the buffer must be C-contiguous")
    if mv.readonly:
        if writable:
            raise TypeError("kvpool: the buffer is read-only")
        copy = bytes(mv)
        p = ctypes.c_char_p(copy)
        return ctypes.cast(p, c_void_p).value, len(copy), (copy, p)
    arr = (ctypes.c_char * mv.nbytes).from_buffer(mv.cast("B"))
    return ctypes.addressof(arr), mv.nbytes, (mv, arr)


def _keys(lora_name=None, cache_salt=None, mm=None, session_id=None, lora_path=None):
    """A kvp_request_keys (and what keeps its strings alive), or (None, None).
    session_id (vLLM 0.33's request.session_id) only annotates the
    BlockStored events the call causes; it never enters a hash. lora_path:
    the LoRA's path (LoRARequest.lora_path), which vLLM 0.33 hashes with its
    name; a pool with vLLM 0.33's rules refuses a name without it."""
    if (lora_name is None and cache_salt is None and not mm and session_id is None
            and lora_path is None):
        return None, None
    feats = []
    for f in mm or []:
        if not isinstance(f, (tuple, list)) or len(f) != 3:
            raise TypeError("kvpool: mm must be (identifier, offset, length) triples")
        feats.append((L.cstr("an mm identifier", f[0], optional=False),
                      L.cint("an mm offset", f[1]), L.cint("an mm length", f[2])))
    arr = (L.MMFeature * max(len(feats), 1))(*[L.MMFeature(i, o, n) for (i, o, n) in feats])
    k = L.RequestKeys(L.cstr("lora_name", lora_name) or None, arr, len(feats),
                      L.cstr("cache_salt", cache_salt) or None,
                      L.cstr("session_id", session_id) or None,
                      L.cstr("lora_path", lora_path) or None)
    return k, (k, arr, feats)


def _group(g):
    """One KV cache group as a dict, with vLLM's kind name."""
    kind = L.GROUP_KINDS[g.kind] if 0 <= g.kind < len(L.GROUP_KINDS) else "unknown"
    d = {"kind": kind, "block_size": g.block_size}
    if kind == "sliding_window":
        d["sliding_window"] = g.window
    elif kind == "chunked_local_attention":
        d["attention_chunk_size"] = g.window
    elif kind == "mamba":
        d["mamba_cache_mode"] = L.MAMBA_MODES[g.mamba_mode] if 0 <= g.mamba_mode < 4 else "?"
    return d


@dataclass
class SlotsResult:
    """AllocateSlots' answer: the new blocks (group after group; per group in
    new_blocks_by_group, 0 where a Mamba group pads with the null block) and
    the token counts."""
    new_blocks: list[int]
    hit_tokens: int
    num_scheduled_tokens: int
    num_computed_tokens: int
    new_blocks_by_group: Optional[list[list[int]]] = None
    # Per group, how many of its new blocks lead it as the external tokens' blocks.
    external_blocks_by_group: Optional[list[int]] = None
