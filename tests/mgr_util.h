/* SPDX-License-Identifier: Apache-2.0 */
/* A manager over a fresh pool, its groups given as kvpoold's groups= text (tests only). */
#ifndef KVP_MGR_UTIL_H
#define KVP_MGR_UTIL_H

#include "pool_util.h"

#include "common/group_spec.h"
#include "engine/manager.h"

struct env {
	struct kvp_pool *pool;
	struct kvp_hasher *hasher;
	struct kvp_mgr *mgr;
	struct kvp_event_batch ev;
	uint32_t ngroups;
};

/* env_open with the pool's vLLM semantics (and that vLLM's extra-key form). */
static inline void
env_open_as(struct env *e, uint32_t n, uint32_t hash_bs, const char *groups, bool caching,
            enum kvp_vllm_semantics sem)
{
	struct kvp_group_spec g[KVP_MAX_GROUPS];
	size_t ng = 0;
	char err[160];
	struct kvp_pool_config pc = {.num_blocks = n, .hash_block_size = hash_bs,
	                             .max_hash_len = 128, .enable_caching = caching,
	                             .enable_events = true, .semantics = sem};

	if (kvp_group_specs_parse(groups, g, KVP_MAX_GROUPS, &ng, err, sizeof(err)) != KVP_OK)
		fail_msg("%s", err);
	struct kvp_mgr_config mc = {.num_groups = (uint32_t)ng, .groups = g,
	                            .max_model_len = 8192, .max_requests = 16};
	assert_ok(kvp_pool_create(&pc, &e->pool));
	assert_ok(kvp_hasher_create("0", &e->hasher));
	if (sem == KVP_VLLM_9AAF83EF5)
		assert_ok(kvp_hasher_set_keys_form(e->hasher, KVP_KEYS_PLAIN)); /* its keys */
	assert_ok(kvp_mgr_create(e->pool, e->hasher, &mc, &e->mgr));
	kvp_event_batch_init(&e->ev);
	e->ngroups = (uint32_t)ng;
}

/*
 * n blocks, hash block size hash_bs, groups such as
 * "full:16+sliding_window:16:32"; the scenarios these tests pin were
 * written against vLLM 9aaf83ef5.
 */
static inline void
env_open(struct env *e, uint32_t n, uint32_t hash_bs, const char *groups, bool caching)
{
	env_open_as(e, n, hash_bs, groups, caching, KVP_VLLM_9AAF83EF5);
}

/* Checks the pool, destroys the manager and checks it released every block. */
static inline void
env_close(struct env *e)
{
	assert_pool_ok(e->pool);
	kvp_mgr_destroy(e->mgr);
	assert_int_equal(kvp_pool_num_free(e->pool), kvp_pool_num_blocks(e->pool) - 1);
	kvp_pool_destroy(e->pool);
	kvp_hasher_destroy(e->hasher);
	kvp_event_batch_fini(&e->ev);
}

/* Adds request id with these tokens as its prompt (no keys). */
static inline void
add_tokens(struct env *e, uint64_t id, const int64_t *tok, size_t n)
{
	struct kvp_request_desc d = {.prompt = tok, .num_prompt = n};
	assert_ok(kvp_mgr_add_request(e->mgr, id, &d));
}

/* The request's block table in group g, its length in *n. */
static inline const int32_t *
table(struct env *e, uint64_t id, uint32_t g, size_t *n)
{
	const int32_t *ids;
	assert_ok(kvp_mgr_request_blocks(e->mgr, id, g, &ids, n));
	return ids;
}

#endif /* KVP_MGR_UTIL_H */
