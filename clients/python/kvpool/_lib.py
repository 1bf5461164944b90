# SPDX-License-Identifier: Apache-2.0
"""ctypes declarations of libkvpool.so's C API (clients/c/kvpool.h and the
common/ headers it includes). Nothing here is compiled: the shared library
is loaded from KVPOOL_LIB, from the build tree next to this package, or by
its soname from the system (an installed kvpool)."""
import ctypes
import ctypes.util
import os
from typing import Any, Optional
from ctypes import (POINTER, Structure, c_bool, c_char, c_char_p, c_double, c_int, c_int32,
                    c_int64, c_size_t, c_uint8, c_uint32, c_uint64, c_void_p)

# The C library's soname (before 1.0 it carries the minor: the ABI may change).
SONAME = "libkvpool.so.0.2"


def _candidates():
    env = os.environ.get("KVPOOL_LIB")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))  # clients/python/kvpool -> repo
    for build in ("build", "build-asan"):
        yield os.path.join(root, build, "clients", "c", SONAME)
    yield SONAME
    found = ctypes.util.find_library("kvpool")
    if found:
        yield found


def _load():
    errors = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            errors.append(f"{path}: no such file")
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            errors.append(str(e))
    raise ImportError(f"kvpool: cannot load {SONAME} (set KVPOOL_LIB, build the tree, "
                      "or install kvpool): " + "; ".join(errors))


lib, path = _load()


class Options(Structure):
    _fields_ = [("url", c_char_p), ("pool", c_char_p), ("token", c_char_p),
                ("client_name", c_char_p), ("lease_ms", c_uint32), ("timeout_ms", c_uint32),
                ("retries", c_uint32), ("tls_ca_file", c_char_p), ("tls_cert_file", c_char_p),
                ("tls_key_file", c_char_p), ("tls_server_name", c_char_p),
                ("session_id", c_uint64), ("connect_timeout_ms", c_uint32),
                ("tls_insecure", c_bool), ("vllm_pod", c_char_p)]


class Executor(Structure):
    _fields_ = [("backend", c_char * 8), ("num_layers", c_uint32), ("num_heads", c_uint32),
                ("head_size", c_uint32), ("block_size", c_uint32), ("dtype", c_char * 8),
                ("layout", c_char * 8), ("block_bytes", c_uint64), ("memory_bytes", c_uint64)]


MAX_GROUPS = 8
MAMBA_MODES = ("auto", "align", "all", "none")


class GroupSpec(Structure):
    """common/group_spec.h's struct kvp_group_spec (enums are C ints)."""
    _fields_ = [("kind", ctypes.c_int), ("block_size", c_uint32), ("window", c_uint32),
                ("mamba_mode", ctypes.c_int)]


class Info(Structure):
    _fields_ = [("session_id", c_uint64), ("lease_ms", c_uint32), ("pool", c_char * 128),
                ("num_blocks", c_uint32), ("hash_block_size", c_uint32),
                ("block_size", c_uint32), ("prefix_caching", ctypes.c_bool),
                ("num_groups", c_uint32), ("groups", GroupSpec * MAX_GROUPS),
                ("hash_algorithm", c_char * 32),
                ("none_hash_fingerprint", c_uint8 * 8), ("medium", c_char * 16),
                ("event_epoch", c_uint64), ("event_seq", c_uint64),
                ("max_model_len", c_uint32), ("max_ids_per_call", c_uint32),
                ("max_hash_len", c_uint32), ("max_msg_bytes", c_uint32),
                ("executor", Executor), ("server_version", c_char * 64),
                ("hash_len", c_uint32), ("region", c_bool)]


class RegionInfo(Structure):
    _fields_ = [("path", c_char * 4096), ("bytes", c_uint64), ("row_bytes", c_uint64),
                ("row_stride", c_uint64), ("num_rows", c_uint32), ("shards", c_uint32),
                ("shard_bytes", c_uint64)]


class Stats(Structure):
    _fields_ = [("num_blocks", c_uint32), ("num_free", c_uint32),
                ("num_cached_blocks", c_uint32), ("num_cached_keys", c_uint32),
                ("usage", c_double), ("blocks_allocated", c_uint64),
                ("blocks_evicted", c_uint64), ("alloc_failures", c_uint64),
                ("blocks_stored", c_uint64), ("resets", c_uint64),
                ("prefix_requests", c_uint64), ("prefix_queries", c_uint64),
                ("prefix_hits", c_uint64), ("sessions", c_uint32),
                ("leases_expired", c_uint64), ("events_emitted", c_uint64),
                ("active_requests", c_uint32)]


class MMFeature(Structure):
    _fields_ = [("identifier", c_char_p), ("offset", c_int64), ("length", c_int64)]


class RequestKeys(Structure):
    _fields_ = [("lora_name", c_char_p), ("mm", POINTER(MMFeature)), ("num_mm", c_size_t),
                ("cache_salt", c_char_p), ("session_id", c_char_p), ("lora_path", c_char_p)]


class Cache(Structure):
    _fields_ = [("block_ids", POINTER(c_int32)), ("num_block_ids", c_size_t),
                ("num_cached_blocks", c_uint32), ("num_full_blocks", c_uint32),
                ("group_id", c_uint32), ("block_size", c_uint32),
                ("hashes", POINTER(c_uint8)), ("num_hashes", c_size_t),
                ("tokens", POINTER(c_int64)), ("num_tokens", c_size_t),
                ("parent_hash", POINTER(c_uint8)), ("keys", POINTER(RequestKeys)),
                ("has_lora_id", c_bool), ("lora_id", c_int64), ("block_mask", POINTER(c_uint8)),
                ("hash_len", c_uint32)]


class Lookup(Structure):
    _fields_ = [("hashes", POINTER(c_uint8)), ("num_hashes", c_size_t),
                ("tokens", POINTER(c_int64)), ("num_tokens", c_size_t),
                ("keys", POINTER(RequestKeys)), ("group_ids", POINTER(c_uint32)),
                ("num_groups", c_size_t), ("block_size", c_uint32), ("hash_len", c_uint32)]


class Slots(Structure):
    _fields_ = [("request_id", c_uint64), ("prompt", POINTER(c_int64)),
                ("num_prompt", c_size_t), ("keys", POINTER(RequestKeys)),
                ("has_lora_id", c_bool), ("lora_id", c_int64),
                ("new_tokens", POINTER(c_int64)), ("num_new_token_ids", c_size_t),
                ("num_new_tokens", c_uint32), ("token_budget", c_uint32),
                ("num_lookahead_tokens", c_uint32), ("use_prefix_cache", c_bool),
                ("delay_cache_blocks", c_bool), ("full_sequence_must_fit", c_bool),
                ("num_external_computed_tokens", c_uint32), ("no_new_tokens", c_bool),
                ("num_in_flight_tokens", c_uint32), ("num_encoder_tokens", c_uint32)]


class SlotsResult(Structure):
    _fields_ = [("hit_tokens", c_uint32), ("num_scheduled_tokens", c_uint32),
                ("num_computed_tokens", c_uint32), ("num_new_blocks", c_size_t),
                ("num_groups", c_uint32), ("new_blocks_per_group", c_uint32 * MAX_GROUPS),
                ("external_blocks_per_group", c_uint32 * MAX_GROUPS)]


CLIENT = c_void_p
I32P, I64P, U8P, U32P = POINTER(c_int32), POINTER(c_int64), POINTER(c_uint8), POINTER(c_uint32)


def _fn(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


kvp_status_name = _fn("kvp_status_name", c_char_p, c_int)
kvp_group_kind_name = _fn("kvp_group_kind_name", c_char_p, c_int)


def _group_kinds():
    """vLLM's kind names in the library's enum order (common/group_spec.h's
    X-list): GroupSpec.kind indexes them."""
    out = []
    while (name := kvp_group_kind_name(len(out)).decode()) != "unknown":
        out.append(name)
    return tuple(out)


GROUP_KINDS = _group_kinds()
kvp_strerror = _fn("kvp_strerror", c_char_p, c_int)
kvp_status_wire_name = _fn("kvp_status_wire_name", c_char_p, c_int)
kvp_client_open = _fn("kvp_client_open", c_int, POINTER(Options), POINTER(CLIENT))
kvp_client_close = _fn("kvp_client_close", None, CLIENT)
kvp_client_renew = _fn("kvp_client_renew", c_int, CLIENT)
kvp_client_info = _fn("kvp_client_info", POINTER(Info), CLIENT)
kvp_client_last_detail = _fn("kvp_client_last_detail", c_char_p, CLIENT)
kvp_client_open_detail = _fn("kvp_client_open_detail", c_char_p)
kvp_client_allocate = _fn("kvp_client_allocate", c_int, CLIENT, c_uint32, I32P)
kvp_client_touch = _fn("kvp_client_touch", c_int, CLIENT, I32P, c_size_t)
kvp_client_free = _fn("kvp_client_free", c_int, CLIENT, I32P, c_size_t)
kvp_client_cache = _fn("kvp_client_cache", c_int, CLIENT, POINTER(Cache), POINTER(c_uint32))
kvp_client_cache_partial = _fn("kvp_client_cache_partial", c_int, CLIENT, POINTER(Cache),
                               c_uint32, c_bool, POINTER(c_bool))
kvp_client_report_cached = _fn("kvp_client_report_cached", c_int, CLIENT, POINTER(Cache),
                               POINTER(c_uint32))
kvp_client_move_hashes = _fn("kvp_client_move_hashes", c_int, CLIENT, c_int32, c_int32)
kvp_client_lookup = _fn("kvp_client_lookup", c_int, CLIENT, POINTER(Lookup), I32P, c_size_t,
                        POINTER(c_uint32), POINTER(c_uint32))
kvp_client_evict = _fn("kvp_client_evict", c_int, CLIENT, I32P, c_size_t, POINTER(c_uint32))
kvp_client_reset = _fn("kvp_client_reset", c_int, CLIENT)
kvp_client_stats = _fn("kvp_client_stats", c_int, CLIENT, POINTER(Stats))
kvp_client_block_keys = _fn("kvp_client_block_keys", c_int, CLIENT, POINTER(c_int32), c_size_t,
                            POINTER(c_uint32), U8P, c_size_t, POINTER(c_uint32), c_size_t,
                            POINTER(c_size_t))
kvp_client_free_queue = _fn("kvp_client_free_queue", c_int, CLIENT, c_int32, POINTER(c_int32),
                            c_size_t, POINTER(c_size_t), POINTER(c_bool))
kvp_client_heartbeat = _fn("kvp_client_heartbeat", c_int, CLIENT)
kvp_client_allocate_slots = _fn("kvp_client_allocate_slots", c_int, CLIENT, POINTER(Slots),
                                I32P, c_size_t, POINTER(SlotsResult))
kvp_client_free_request = _fn("kvp_client_free_request", c_int, CLIENT, c_uint64, c_bool)
kvp_client_get_computed_blocks = _fn("kvp_client_get_computed_blocks", c_int, CLIENT, c_uint64,
                                     I32P, c_size_t, POINTER(c_size_t), POINTER(c_uint32))
kvp_client_read_blocks = _fn("kvp_client_read_blocks", c_int, CLIENT, I32P, c_size_t, c_void_p,
                             c_size_t, U32P)
kvp_client_write_blocks = _fn("kvp_client_write_blocks", c_int, CLIENT, I32P, c_size_t, c_void_p,
                              c_size_t)
kvp_region_open = _fn("kvp_region_open", c_int, CLIENT, POINTER(c_void_p))
kvp_region_close = _fn("kvp_region_close", None, c_void_p)
kvp_region_info = _fn("kvp_region_info", POINTER(RegionInfo), c_void_p)
kvp_region_row = _fn("kvp_region_row", c_void_p, c_void_p, c_int32)
kvp_region_check = _fn("kvp_region_check", c_bool, c_void_p, c_int32, c_uint32)
kvp_region_fd = _fn("kvp_region_fd", c_int, c_void_p)
kvp_region_crc = _fn("kvp_region_crc", c_int, c_void_p, c_int32, POINTER(c_uint32))
kvp_copy_many = _fn("kvp_copy_many", c_int, c_void_p, c_void_p, c_void_p, c_size_t, ctypes.c_uint)
kvp_client_key_len = _fn("kvp_client_key_len", c_size_t, CLIENT)
kvp_client_reserve = _fn("kvp_client_reserve", c_int, CLIENT, U8P, c_size_t, I32P, U8P,
                         POINTER(c_size_t))
kvp_client_commit = _fn("kvp_client_commit", c_int, CLIENT, U8P, c_size_t, U32P, c_bool)
kvp_client_abort = _fn("kvp_client_abort", c_int, CLIENT, U8P, c_size_t)
kvp_client_lookup_lock = _fn("kvp_client_lookup_lock", c_int, CLIENT, U8P, c_size_t, c_bool, I32P,
                             U32P, POINTER(c_size_t), POINTER(c_uint32))
kvp_client_lookup_lock_uncounted = _fn("kvp_client_lookup_lock_uncounted", c_int, CLIENT, U8P,
                                       c_size_t, I32P, U32P, U32P)
kvp_client_unlock = _fn("kvp_client_unlock", c_int, CLIENT, U8P, c_size_t)
kvp_client_cluster_fill = _fn("kvp_client_cluster_fill", c_int, CLIENT, U8P, c_size_t, U8P,
                              c_size_t, POINTER(c_size_t), POINTER(c_uint32))
kvp_client_cluster_announce = _fn("kvp_client_cluster_announce", c_int, CLIENT, U8P, c_size_t,
                                  U8P, c_size_t)
kvp_client_copy_blocks = _fn("kvp_client_copy_blocks", c_int, CLIENT, I32P, I32P, c_size_t)
kvp_hasher_create = _fn("kvp_hasher_create", c_int, c_char_p, POINTER(c_void_p))
kvp_hasher_create_algo = _fn("kvp_hasher_create_algo", c_int, c_char_p, c_int, POINTER(c_void_p))
kvp_hash_algo_parse = _fn("kvp_hash_algo_parse", c_int, c_char_p, POINTER(c_int))
kvp_hasher_destroy = _fn("kvp_hasher_destroy", None, c_void_p)
kvp_hasher_none_hash = _fn("kvp_hasher_none_hash", U8P, c_void_p)
kvp_hasher_none_len = _fn("kvp_hasher_none_len", c_size_t, c_void_p)
kvp_hash_raw = _fn("kvp_hash_raw", c_int, c_void_p, c_void_p, c_size_t, U8P)
kvp_hasher_len = _fn("kvp_hasher_len", c_size_t, c_void_p)
kvp_hasher_set_keys_form = _fn("kvp_hasher_set_keys_form", c_int, c_void_p, c_int)
KEYS_FORMS = {"0.33": 0, "9aaf83ef5": 1}  # enum kvp_keys_form by a pool's vllm= rules
kvp_hash_request = _fn("kvp_hash_request", c_int, c_void_p, POINTER(RequestKeys), I64P, c_size_t,
                       c_uint32, U8P, c_size_t, U8P, c_size_t, POINTER(c_size_t))
kvp_client_lookup_refs = _fn("kvp_client_lookup_refs", c_int, CLIENT, POINTER(Lookup), I32P, U32P,
                             c_size_t, POINTER(c_uint32), POINTER(c_uint32))
kvp_client_find_hit = _fn("kvp_client_find_hit", c_int, CLIENT, U8P, c_size_t, c_uint32, c_uint32,
                          I32P, U32P, c_size_t, U32P, POINTER(c_uint32), POINTER(c_uint32))
kvp_client_event_position = _fn("kvp_client_event_position", c_int, CLIENT, POINTER(c_uint64),
                                POINTER(c_uint64))
kvp_client_write_tokens = _fn("kvp_client_write_tokens", c_int, CLIENT, c_bool, c_uint32, I64P,
                              c_size_t, c_void_p, c_void_p, c_size_t)

# ---- the batch (clients/c/kvpool.h) ----
BATCH = c_void_p
BATCH_CONTINUE, BATCH_BORROW = 0x1, 0x2


class BatchResult(Structure):
    _fields_ = [("status", c_int), ("detail", c_char_p), ("has_block_ids", c_bool),
                ("block_ids", I32P), ("num_block_ids", c_size_t), ("count", c_uint32),
                ("slots", SlotsResult), ("hashes", U8P), ("num_hashes", c_size_t),
                ("has_stats", c_bool), ("stats", Stats), ("ref_cnts", U32P)]


kvp_batch_create = _fn("kvp_batch_create", c_int, POINTER(BATCH))
kvp_batch_destroy = _fn("kvp_batch_destroy", None, BATCH)
kvp_batch_clear = _fn("kvp_batch_clear", None, BATCH)
kvp_batch_count = _fn("kvp_batch_count", c_size_t, BATCH)
kvp_batch_set_flags = _fn("kvp_batch_set_flags", c_int, BATCH, ctypes.c_uint)
kvp_batch_allocate = _fn("kvp_batch_allocate", c_int, BATCH, c_uint32)
kvp_batch_touch = _fn("kvp_batch_touch", c_int, BATCH, I32P, c_size_t)
kvp_batch_free = _fn("kvp_batch_free", c_int, BATCH, I32P, c_size_t)
kvp_batch_evict = _fn("kvp_batch_evict", c_int, BATCH, I32P, c_size_t)
kvp_batch_cache = _fn("kvp_batch_cache", c_int, BATCH, POINTER(Cache))
kvp_batch_lookup = _fn("kvp_batch_lookup", c_int, BATCH, POINTER(Lookup))
kvp_batch_allocate_slots = _fn("kvp_batch_allocate_slots", c_int, BATCH, POINTER(Slots))
kvp_batch_free_request = _fn("kvp_batch_free_request", c_int, BATCH, c_uint64, c_bool)
kvp_batch_get_computed_blocks = _fn("kvp_batch_get_computed_blocks", c_int, BATCH, c_uint64)
kvp_batch_stats = _fn("kvp_batch_stats", c_int, BATCH)
kvp_batch_reserve = _fn("kvp_batch_reserve", c_int, BATCH, c_void_p, c_size_t, c_size_t)
kvp_batch_commit = _fn("kvp_batch_commit", c_int, BATCH, c_void_p, c_size_t, c_size_t, c_void_p)
kvp_batch_abort = _fn("kvp_batch_abort", c_int, BATCH, c_void_p, c_size_t, c_size_t)
kvp_batch_lookup_lock = _fn("kvp_batch_lookup_lock", c_int, BATCH, c_void_p, c_size_t, c_size_t,
                            c_bool)
kvp_batch_unlock = _fn("kvp_batch_unlock", c_int, BATCH, c_void_p, c_size_t, c_size_t)
kvp_client_batch = _fn("kvp_client_batch", c_int, CLIENT, BATCH, POINTER(c_size_t))
kvp_batch_result = _fn("kvp_batch_result", c_int, BATCH, c_size_t, POINTER(BatchResult))
kvp_batch_allocate_slots_n = _fn("kvp_batch_allocate_slots_n", c_int, BATCH, c_size_t,
                                 POINTER(c_uint64), U32P, U32P, I64P, c_uint32, c_bool)
kvp_batch_slots_results = _fn("kvp_batch_slots_results", c_int, BATCH, c_size_t, c_size_t,
                              c_size_t, POINTER(c_int32), U32P, U32P, I32P, c_size_t,
                              POINTER(c_size_t))

# ---- events, the subscriber, the index (common/events.h, subscriber.h, kvindex.h) ----
EVENT_STORED, EVENT_REMOVED, EVENT_CLEARED = 1, 2, 3


class Event(Structure):
    _fields_ = [("type", c_int), ("num_hashes", c_uint32), ("hash_len", c_uint32),
                ("hashes", U8P), ("parent", U8P), ("token_ids", I64P), ("num_tokens", c_uint32),
                ("block_size", c_uint32), ("has_lora_id", c_bool), ("lora_id", c_int64),
                ("lora_name", c_char_p), ("medium", c_char_p), ("session_id", c_char_p),
                ("extra_keys", U8P),
                ("extra_key_offsets", U32P), ("has_group_idx", c_bool), ("group_idx", c_uint32),
                ("spec_kind", c_char_p), ("has_sliding_window", c_bool),
                ("sliding_window", c_int64)]


class SnapshotEntry(Structure):
    _fields_ = [("hash", U8P), ("hash_len", c_size_t), ("group_idx", c_uint32),
                ("num_blocks", c_uint32)]


class Snapshot(Structure):
    _fields_ = [("epoch", c_uint64), ("next_seq", c_uint64), ("entries", POINTER(SnapshotEntry)),
                ("num_entries", c_size_t), ("storage", c_void_p)]


class SubOptions(Structure):
    _fields_ = [("events_url", c_char_p), ("rpc_url", c_char_p), ("pool", c_char_p),
                ("pools", POINTER(c_char_p)), ("num_pools", c_size_t), ("token", c_char_p),
                ("timeout_ms", c_uint32), ("recv_buffer", c_int), ("tls_ca_file", c_char_p),
                ("tls_cert_file", c_char_p), ("tls_key_file", c_char_p),
                ("tls_server_name", c_char_p), ("connect_timeout_ms", c_uint32),
                ("tls_insecure", c_bool)]


RESET_FN = ctypes.CFUNCTYPE(None, c_void_p, c_char_p, c_uint64, c_uint64,
                            POINTER(SnapshotEntry), c_size_t)
BATCH_FN = ctypes.CFUNCTYPE(None, c_void_p, c_char_p, c_uint64, c_uint64, c_uint64, c_void_p)


class SubHandler(Structure):
    _fields_ = [("ctx", c_void_p), ("reset", RESET_FN), ("batch", BATCH_FN)]


class SubStats(Structure):
    _fields_ = [("epoch", c_uint64), ("next_seq", c_uint64), ("batches", c_uint64),
                ("gaps", c_uint64), ("replayed", c_uint64), ("resets", c_uint64),
                ("lag", c_uint64)]


kvp_event_batch_count = _fn("kvp_event_batch_count", c_size_t, c_void_p)
kvp_event_batch_get = _fn("kvp_event_batch_get", c_int, c_void_p, c_size_t, POINTER(Event))
kvp_client_snapshot = _fn("kvp_client_snapshot", c_int, CLIENT, POINTER(POINTER(Snapshot)))
kvp_snapshot_free = _fn("kvp_snapshot_free", None, POINTER(Snapshot))
kvp_sub_open = _fn("kvp_sub_open", c_int, POINTER(SubOptions), POINTER(SubHandler),
                   POINTER(c_void_p))
kvp_sub_poll = _fn("kvp_sub_poll", c_int, c_void_p, c_uint32)
kvp_sub_fd = _fn("kvp_sub_fd", c_int, c_void_p, POINTER(c_int))
kvp_sub_get_stats = _fn("kvp_sub_get_stats", c_int, c_void_p, c_char_p, POINTER(SubStats))
kvp_sub_last_detail = _fn("kvp_sub_last_detail", c_char_p, c_void_p)
kvp_sub_close = _fn("kvp_sub_close", None, c_void_p)
kvp_index_create = _fn("kvp_index_create", c_int, POINTER(c_void_p))
kvp_index_destroy = _fn("kvp_index_destroy", None, c_void_p)
kvp_index_reset = _fn("kvp_index_reset", c_int, c_void_p, POINTER(SnapshotEntry), c_size_t)
kvp_index_apply = _fn("kvp_index_apply", c_int, c_void_p, c_void_p)
kvp_index_count = _fn("kvp_index_count", c_uint32, c_void_p, U8P, c_size_t, c_uint32)
kvp_index_size = _fn("kvp_index_size", c_size_t, c_void_p)
kvp_index_prefix = _fn("kvp_index_prefix", c_size_t, c_void_p, U8P, c_size_t, c_size_t, c_uint32)
kvp_index_equals = _fn("kvp_index_equals", c_bool, c_void_p, POINTER(SnapshotEntry), c_size_t)


def cstr(what: str, v: Any, optional: bool = True) -> Optional[bytes]:
    """A str or bytes argument as the bytes a C string field takes (None
    stays None where optional). Anything else is a TypeError: ctypes would
    take an int as a pointer and the C code would read whatever is there."""
    if v is None and optional:
        return None
    if isinstance(v, str):
        v = v.encode()
    if not isinstance(v, bytes):
        raise TypeError(f"kvpool: {what} must be a str, not {type(v).__name__}")
    if b"\0" in v:
        raise ValueError(f"kvpool: {what} must not contain a NUL byte")
    return v


def cint(what: str, v: Any, lo: int = 0, hi: int = (1 << 63) - 1) -> int:
    """An int argument within [lo, hi] (bool refused), else TypeError or ValueError."""
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"kvpool: {what} must be an int, not {type(v).__name__}")
    if not lo <= v <= hi:
        raise ValueError(f"kvpool: {what} must be in [{lo}, {hi}], not {v}")
    return v
