/* SPDX-License-Identifier: Apache-2.0 */
/*
 * manager.h: the request-level layer over one BlockPool, what a scheduler
 * really calls (reference section 5: KVCacheManager with its coordinator and
 * full-attention single-type managers).
 *
 * The manager keeps, per request: its token ids, its chain of fine block
 * hashes (extended as tokens are appended; none when caching is off), its
 * block table per KV cache group, and how many of those blocks are cached.
 * Several groups share the pool, told apart by the group id in the map key.
 *
 * Group kinds (common/group_spec.h), each as vLLM's single-type manager:
 * full attention; sliding window (blocks that leave the window are freed
 * and replaced by the null block as the request advances; a hit needs only
 * the window's last cdiv(window - 1, bs) blocks); chunked local attention
 * (blocks before the current chunk are null); Mamba in modes align (vLLM's
 * default with caching: one running state block per step), all and none;
 * cross-attention (an encoder-decoder model's: blocks for the encoder's
 * tokens, allocated once, never cached, only with caching off).
 * One group is vLLM's unitary coordinator; several are its hybrid one:
 * identical specs merge into one attention group, full attention first,
 * and the hit is the fixed point every attention group agrees on, a
 * multiple of the LCM of the block sizes (one pass for 1 full + 1 other);
 * caching rounds down to that LCM, and a sliding-window group under a
 * coarser LCM caches only the blocks a hit can use. A group whose block
 * size is k x hash_block_size uses coarse hashes of k fine hashes.
 * With caching off nothing is hashed, looked up or cached.
 *
 * External (connector) computed tokens get blocks as vLLM's
 * allocate_new_computed_blocks gives them (kvp_alloc_args).
 *
 * Not supported: eagle's last-block drop, Mamba speculative blocks,
 * external tokens beside a Mamba align or a cross-attention group, sink
 * groups, prompt-embeds extra keys, and vLLM's newer per-request admission
 * cap for recycling groups (issue #39734), watermark and reserved_blocks.
 *
 * Differences from vLLM, as in pool.h, are refusals instead of asserts:
 * unknown requests are KVP_ENOTFOUND; hit blocks passed to allocate_slots
 * are checked against the request's hashes (a remote caller may pass ids
 * that were evicted since its lookup: KVP_ESTATE, look up again); hits for
 * a request that already holds blocks are KVP_EINVAL (vLLM asserts).
 * allocate_slots refused with KVP_ENOSPACE changed nothing except what vLLM
 * also does before its capacity check: blocks that left a sliding window
 * or chunk (or an old Mamba state) are freed. (If memory runs out mid-step,
 * KVP_ENOMEM is returned and the step may be partly applied; the pool stays
 * consistent.)
 *
 * The manager counts the request's computed tokens itself: after a
 * successful allocate_slots it is hit + previously computed + new tokens,
 * as vLLM's scheduler sets it when nothing is rejected.
 *
 * Not thread-safe; borrows the pool and hasher (one thread at a time for
 * all three). Never prints, reads no clock.
 */
#ifndef KVP_MANAGER_H
#define KVP_MANAGER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/block_hash.h"
#include "common/events.h"
#include "common/group_spec.h"
#include "engine/pool.h"

#define KVP_MGR_MAX_GROUPS KVP_MAX_GROUPS

struct kvp_mgr_config {
	uint32_t num_groups;        /* 1..KVP_MGR_MAX_GROUPS; group ids are 0..num_groups-1 */
	const struct kvp_group_spec *groups; /* per group; Mamba AUTO resolves by caching */
	const uint32_t *block_sizes; /* if groups is NULL: full-attention groups of these sizes */
	uint32_t max_model_len;     /* tokens per request, >= 1 */
	uint32_t max_requests;      /* live requests; 0: 65536 */
};

/* A new request, as the scheduler describes it. Everything is copied. */
struct kvp_request_desc {
	const int64_t *prompt;      /* prompt token ids */
	size_t num_prompt;          /* 1..max_model_len */
	const struct kvp_request_keys *keys; /* LoRA name, mm features, salt; NULL: none */
	bool has_lora_id;           /* the LoRA adapter's int id (events only) */
	int64_t lora_id;
	bool skip_reading_prefix_cache; /* prompt logprobs, pooling: never hit */
};

/* allocate_slots arguments (vLLM's names). */
struct kvp_alloc_args {
	uint32_t num_new_tokens;           /* >= 1 */
	uint32_t num_new_computed_tokens;  /* hit tokens from get_computed_blocks */
	const int32_t *const *computed_blocks; /* per group: the hit blocks, or NULL if no hit */
	uint32_t num_lookahead_tokens;
	bool delay_cache_blocks;
	/*
	 * vLLM's admission gate: refuse (KVP_ENOSPACE, before anything changes,
	 * skipped blocks included) unless the request's whole known length,
	 * min(its tokens, max_model_len), fits, not only this step's chunk.
	 */
	bool full_sequence_must_fit;
	/*
	 * Tokens a KV connector computed (vLLM's num_external_computed_tokens),
	 * after the hit; the request must have them. num_new_tokens may be 0
	 * with them (an asynchronous load). A request holding no blocks gets new
	 * blocks for those still in its window (nulls for the rest); they lead
	 * new_blocks[g], and *num_external_blocks (per group, NULL: not asked)
	 * says how many. Not with a Mamba align or cross-attention group
	 * (KVP_ENOTSUP).
	 */
	uint32_t num_external_computed_tokens;
	size_t *num_external_blocks;
	/*
	 * Tokens of earlier steps still in flight (vLLM 0.33's
	 * num_in_flight_tokens): skipped blocks are freed below the computed
	 * tokens less these (vLLM frees on the processed-token basis).
	 */
	uint32_t num_in_flight_tokens;
	/*
	 * The encoder's tokens (vLLM's num_encoder_tokens): a cross-attention
	 * group holds blocks for these, allocated once (a later call with as
	 * many or fewer adds none); other groups ignore it. More blocks than
	 * the pool has: KVP_ENOSPACE.
	 */
	uint32_t num_encoder_tokens;
};

struct kvp_mgr_stats {
	uint64_t requests, queries, hits;        /* prefix-cache lookups, in tokens */
	uint64_t preempted_requests, preempted_queries, preempted_hits;
	uint64_t alloc_failures;                 /* allocate_slots refused with KVP_ENOSPACE */
	uint64_t active_requests;
};

struct kvp_mgr;

/*
 * Creates a manager over pool (which must outlive it) hashing with hasher
 * (the pool's NONE_HASH owner). KVP_EINVAL (bad config: groups refused by
 * kvp_group_specs_validate() for the pool's hash block size and caching, a
 * coarse hash longer than the pool's max_hash_len, a hasher whose digest is
 * not the pool's hash_len), KVP_ENOMEM.
 */
int kvp_mgr_create(struct kvp_pool *pool, struct kvp_hasher *hasher,
                   const struct kvp_mgr_config *cfg, struct kvp_mgr **out);
/* Destroys the manager; blocks still held by requests are freed first. NULL: no-op. */
void kvp_mgr_destroy(struct kvp_mgr *m);

/*
 * Adds a request and hashes its full prompt blocks. KVP_EINVAL (bad desc,
 * prompt empty or over max_model_len, bad keys), KVP_ESTATE (id in use),
 * KVP_EBUSY (max_requests live), KVP_ENOMEM.
 */
int kvp_mgr_add_request(struct kvp_mgr *m, uint64_t req_id, const struct kvp_request_desc *d);

/*
 * Appends generated tokens and hashes newly completed blocks (vLLM's
 * append_output_token_ids + request block hasher). KVP_ENOTFOUND, KVP_EINVAL
 * (would exceed max_model_len), KVP_ENOMEM.
 */
int kvp_mgr_append_tokens(struct kvp_mgr *m, uint64_t req_id, const int64_t *tokens, size_t n);

/*
 * get_computed_blocks: the longest prefix hit, capped at num_tokens - 1
 * (the last token is always recomputed), as the coordinator finds it. Writes
 * group g's hit blocks to out[g] (hit / block size entries, the null block
 * where the group's kind skips a block; cap entries each; NULL allowed when
 * cap is 0 and only the length is wanted) and the hit length in tokens to
 * *hit_tokens. Counts one prefix-cache query. Takes no references: the
 * blocks may be evicted until allocate_slots touches them.
 * KVP_ENOTFOUND, KVP_EINVAL (cap too small: nothing written, nothing counted).
 */
int kvp_mgr_get_computed_blocks(struct kvp_mgr *m, uint64_t req_id, int32_t *const *out,
                                size_t cap, uint32_t *hit_tokens);

/*
 * find_longest_cache_hit over a hash chain no request holds (vLLM's
 * coordinator for a waiting request's block_hashes): the fine hashes
 * (hash_len bytes each) capped at max_len tokens, written out as
 * kvp_mgr_get_computed_blocks writes its hit, and *uncached: vLLM 0.33's
 * num_uncached_common_prefix_tokens, the longer prefix one attention group
 * holds than the hit every group agrees on (0 on a unitary pool). Counts
 * no query, takes no references. KVP_EINVAL (cap too small: nothing
 * written), KVP_ENOMEM.
 */
int kvp_mgr_find_hit(struct kvp_mgr *m, const uint8_t *hashes, size_t num_hashes, size_t max_len,
                     int32_t *const *out, size_t cap, uint32_t *hit_tokens, uint32_t *uncached);

/*
 * allocate_slots: frees blocks that left a window, touches the hits,
 * allocates blocks for the tokens to compute (plus lookahead) in group
 * order, and caches blocks that became full (one BlockStored per group that
 * cached any). Writes the entries group g's block table gained to
 * new_blocks[g] (a Mamba align group's include the null blocks it pads
 * with; cap each, may be NULL if cap is 0 and none are needed) and their
 * counts to counts[g]. KVP_ENOSPACE: the caller must preempt; nothing else
 * changed (see above). KVP_ENOTFOUND, KVP_EINVAL, KVP_ESTATE (a hit
 * block is no longer cached under the request's hash), KVP_ENOMEM.
 */
int kvp_mgr_allocate_slots(struct kvp_mgr *m, uint64_t req_id, const struct kvp_alloc_args *a,
                           int32_t *const *new_blocks, size_t cap, size_t *counts);

/*
 * Preempts a request: frees its blocks (each group's in reverse, so its
 * deepest blocks are evicted first) and resets its computed tokens to 0;
 * the request keeps its tokens and hashes and can be scheduled again.
 * KVP_ENOTFOUND.
 */
int kvp_mgr_preempt(struct kvp_mgr *m, uint64_t req_id);

/* free(request): frees its blocks as preempt does, then forgets it. KVP_ENOTFOUND. */
int kvp_mgr_free_request(struct kvp_mgr *m, uint64_t req_id);

/* The number of KV cache groups (group ids are 0 .. this - 1). */
uint32_t kvp_mgr_num_groups(const struct kvp_mgr *m);
/* Group g's spec (Mamba mode resolved), or NULL if g is out of range. */
const struct kvp_group_spec *kvp_mgr_group_spec(const struct kvp_mgr *m, uint32_t g);

/* A request's blocks in group g (valid until the next call), its token count. */
int kvp_mgr_request_blocks(const struct kvp_mgr *m, uint64_t req_id, uint32_t g,
                           const int32_t **ids, size_t *n);
int kvp_mgr_request_info(const struct kvp_mgr *m, uint64_t req_id, size_t *num_tokens,
                         size_t *num_computed, size_t *num_hashes);

/*
 * Takes the pool's events, setting each BlockStored's spec kind (vLLM's
 * name, "sliding_window" ...) and, for a sliding-window group, its window.
 */
int kvp_mgr_take_events(struct kvp_mgr *m, struct kvp_event_batch *out);

void kvp_mgr_get_stats(const struct kvp_mgr *m, struct kvp_mgr_stats *out);

#endif /* KVP_MANAGER_H */
