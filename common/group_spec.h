/* SPDX-License-Identifier: Apache-2.0 */
/*
 * group_spec.h: a pool's KV cache groups, described once (vLLM's
 * KVCacheGroupSpec reduced to what block management needs: the kind of
 * attention, the group's block size and, per kind, its window).
 *
 * The same description travels unchanged from configuration to the
 * manager, to Hello, to the events and to the clients, so it lives in the
 * shared layer. Text form (configuration, kvpoolctl, logs), one item per
 * group joined by '+':
 *
 *   full:16                  full attention, block size 16
 *   sliding_window:16:128    sliding window of 128 tokens
 *   chunked_local:16:8192    chunked local attention, chunk of 8192 tokens
 *   mamba:16[:align|all|none] Mamba state; vLLM's cache mode (default: align
 *                            with prefix caching, none without, as vLLM)
 *   cross_attention:16       an encoder-decoder model's cross-attention: one
 *                            static allocation for the encoder's tokens;
 *                            only in a pool with caching off (vLLM turns
 *                            prefix caching off for such models)
 *
 * The kinds' long names are vLLM's (KVCacheSpecKind values, as BlockStored
 * events carry them): "full_attention", "sliding_window",
 * "chunked_local_attention", "mamba", "cross_attention"; either name parses.
 *
 * Pure: no I/O, no allocation; thread-safe.
 */
#ifndef KVP_GROUP_SPEC_H
#define KVP_GROUP_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVP_MAX_GROUPS 8

/* X(id, short name, vLLM's kind name) */
#define KVP_GROUP_KINDS(X)                                         \
	X(FULL, "full", "full_attention")                          \
	X(SLIDING_WINDOW, "sliding_window", "sliding_window")      \
	X(CHUNKED_LOCAL, "chunked_local", "chunked_local_attention") \
	X(MAMBA, "mamba", "mamba")                                 \
	X(CROSS_ATTENTION, "cross_attention", "cross_attention")

enum kvp_group_kind {
#define KVP_X_(id, s, l) KVP_GROUP_##id,
	KVP_GROUP_KINDS(KVP_X_)
#undef KVP_X_
	KVP_GROUP_NUM_KINDS
};

/* vLLM's mamba_cache_mode (vllm/config/cache.py). */
enum kvp_mamba_mode {
	KVP_MAMBA_AUTO = 0,  /* vLLM's default: align with prefix caching, none without */
	KVP_MAMBA_ALIGN,     /* one running state block, cached at block boundaries */
	KVP_MAMBA_ALL,       /* every block boundary's state kept (deprecated in vLLM) */
	KVP_MAMBA_NONE,      /* prefix caching off: blocks as for full attention, one state kept */
};

struct kvp_group_spec {
	enum kvp_group_kind kind;
	uint32_t block_size;          /* tokens per block, >= 1 */
	uint32_t window;              /* SLIDING_WINDOW: the window; CHUNKED_LOCAL: the chunk; else 0 */
	enum kvp_mamba_mode mamba_mode; /* MAMBA only */
};

/* vLLM's kind name ("full_attention", ...), or "unknown". */
const char *kvp_group_kind_name(enum kvp_group_kind k);
/* The short name used in the text form ("full", ...), or "unknown". */
const char *kvp_group_kind_short(enum kvp_group_kind k);
/* Parses either name. KVP_OK or KVP_EINVAL (*out unchanged). */
int kvp_group_kind_parse(const char *s, enum kvp_group_kind *out);
const char *kvp_mamba_mode_name(enum kvp_mamba_mode m);
/* Parses "align", "all" or "none". KVP_OK or KVP_EINVAL (*out unchanged). */
int kvp_mamba_mode_parse(const char *s, enum kvp_mamba_mode *out);

/*
 * Two specs are the same group kind for vLLM's coordinator (merged into one
 * attention group) when every field is equal.
 */
bool kvp_group_spec_equal(const struct kvp_group_spec *a, const struct kvp_group_spec *b);

/*
 * Parses the text form into out[0..cap), *n groups. KVP_EINVAL with a
 * message in err (if non-NULL) naming the bad item: unknown kind, missing
 * or extra field, a number out of range (block size 1..65536, window
 * 1..2^30), more than cap groups. Nothing is written to out or *n on error.
 */
int kvp_group_specs_parse(const char *text, struct kvp_group_spec *out, size_t cap, size_t *n,
                          char *err, size_t err_len);

/*
 * Writes the text form of groups[0..n) to buf (NUL-terminated). KVP_EINVAL
 * if it does not fit (buf then holds an empty string when cap > 0).
 */
int kvp_group_specs_format(const struct kvp_group_spec *groups, size_t n, char *buf, size_t cap);

/*
 * Checks a pool's groups the way vLLM's coordinators assert them, so that a
 * bad pool is refused at start with a message: 1..KVP_MAX_GROUPS groups;
 * windows >= 1 where the kind has one and 0 where it has none; with
 * prefix caching, every block size a multiple of hash_block_size, and a
 * chunked-local group's block size equal to the LCM of all block sizes
 * (vLLM asserts it in find_longest_cache_hit). KVP_OK or KVP_EINVAL.
 */
int kvp_group_specs_validate(const struct kvp_group_spec *groups, size_t n,
                             uint32_t hash_block_size, bool enable_caching, char *err,
                             size_t err_len);

/* Resolves KVP_MAMBA_AUTO as vLLM does: align with prefix caching, none without. */
void kvp_group_specs_resolve(struct kvp_group_spec *groups, size_t n, bool enable_caching);

/*
 * vLLM's default hash block size for these groups (resolve_kv_cache_block_sizes):
 * one group's block size, or the GCD of several. 0 if n is 0.
 */
uint32_t kvp_group_specs_hash_block_size(const struct kvp_group_spec *groups, size_t n);

/* The LCM of the block sizes (0 if it exceeds UINT32_MAX or n is 0). */
uint32_t kvp_group_specs_lcm(const struct kvp_group_spec *groups, size_t n);

struct kvp_event_batch;
/*
 * Names each BlockStored event's group kind and window, from its group
 * index (vLLM's KVCacheManager.take_events); events of no known group are
 * left as they are.
 */
void kvp_group_specs_annotate(const struct kvp_group_spec *groups, size_t n,
                              struct kvp_event_batch *b);

#endif /* KVP_GROUP_SPEC_H */
