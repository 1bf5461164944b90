/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers shared by the pool tests: pools, synthetic hashes, event checks. */
#ifndef KVP_POOL_UTIL_H
#define KVP_POOL_UTIL_H

#include "kvp_test.h"

#include "engine/pool.h"

static inline struct kvp_pool *
mkpool_sem(uint32_t n, uint32_t bs, bool events, enum kvp_vllm_semantics sem)
{
	struct kvp_pool_config cfg = {
		.num_blocks = n, .hash_block_size = bs, .enable_caching = true,
		.enable_events = events, .semantics = sem,
	};
	struct kvp_pool *p = NULL;
	assert_ok(kvp_pool_create(&cfg, &p));
	return p;
}

/*
 * A pool with vLLM 9aaf83ef5's rules: the reference spec's scenarios
 * (../shared/reference/scenarios.md) were written against that commit.
 */
static inline struct kvp_pool *
mkpool(uint32_t n, uint32_t bs, bool events)
{
	return mkpool_sem(n, bs, events, KVP_VLLM_9AAF83EF5);
}

/* Synthetic hashes: X = b"X" * 32. */
static inline const uint8_t *
synth(char c)
{
	static uint8_t h[26][KVP_HASH_LEN];
	memset(h[c - 'A'], c, KVP_HASH_LEN);
	return h[c - 'A'];
}

/* R[hashes]: a request whose all_token_ids are 0, 1, 2, ... */
struct req {
	uint8_t hashes[16 * KVP_HASH_LEN];
	size_t n;
	int64_t tokens[256];
};

static inline void
req_init(struct req *r, const char *names)
{
	r->n = strlen(names);
	for (size_t i = 0; i < r->n; i++)
		memcpy(r->hashes + i * KVP_HASH_LEN, synth(names[i]), KVP_HASH_LEN);
	for (int i = 0; i < 256; i++)
		r->tokens[i] = i;
}

static inline int
cache(struct kvp_pool *p, const struct req *r, const int32_t *blocks, size_t nblocks,
      uint32_t c, uint32_t f, uint32_t bs, uint32_t g)
{
	struct kvp_cache_args a = {
		.block_hashes = r->hashes, .num_block_hashes = r->n,
		.token_ids = r->tokens, .num_tokens = 256,
		.num_cached_blocks = c, .num_full_blocks = f, .block_size = bs, .group_id = g,
	};
	return kvp_pool_cache_full_blocks(p, blocks, nblocks, &a);
}

/* Fails the test with the pool's own account of a broken invariant. */
static inline void
check(struct kvp_pool *p)
{
	char why[256];
	if (kvp_pool_check(p, why, sizeof(why)) != KVP_OK)
		fail_msg("pool invariant: %s", why);
}

static inline void
assert_queue_impl(struct kvp_pool *p, const int32_t *want, size_t n, const char *f, int l)
{
	int32_t got[1024];
	size_t ng = kvp_pool_free_queue(p, got, N_ELEMS(got));
	kvp_test_ids_equal(got, ng, want, n, "free queue", f, l);
	assert_int_equal(kvp_pool_num_free(p), ng);
}

#define assert_queue(p, ...)                                                       \
	do {                                                                       \
		const int32_t q_[] = {__VA_ARGS__};                                \
		assert_queue_impl((p), q_, N_ELEMS(q_), __FILE__, __LINE__);       \
	} while (0)

static inline void
assert_pool_ok(struct kvp_pool *p)
{
	char detail[256] = "";
	if (kvp_pool_check(p, detail, sizeof(detail)) != KVP_OK)
		fail_msg("invariant broken: %s", detail);
}

static inline void
assert_removed(const struct kvp_event_batch *b, size_t i, char hash, uint32_t group)
{
	struct kvp_event ev;
	assert_ok(kvp_event_batch_get(b, i, &ev));
	assert_int_equal(ev.type, KVP_EVENT_BLOCK_REMOVED);
	assert_int_equal(ev.num_hashes, 1);
	assert_int_equal(ev.hash_len, KVP_HASH_LEN);
	assert_memory_equal(ev.hashes, synth(hash), KVP_HASH_LEN);
	assert_string_equal(ev.medium, "GPU");
	assert_true(ev.has_group_idx);
	assert_int_equal(ev.group_idx, group);
}

#endif /* KVP_POOL_UTIL_H */
