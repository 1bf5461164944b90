/* SPDX-License-Identifier: Apache-2.0 */
/* Request-level calls: vLLM's KVCacheManager over the wire. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service/rpc/call.h"
#include "common/kvp_status.h"
#include "engine/manager.h"
#include "engine/pool.h"
#include "proto/wire.h"

static int
mgr_status(struct call *c, int rv, const char *what)
{
	switch (rv) {
	case KVP_OK:
		return KVP_OK;
	case KVP_ENOSPACE:
		return kvpd_fail(c, rv, "%s: not enough free blocks (%u free): preempt and retry", what,
		            kvp_pool_num_free(c->p->pool));
	case KVP_ESTATE:
		return kvpd_fail(c, rv, "%s: a prefix hit was evicted meanwhile, or the request is in a "
		                   "state that forbids this", what);
	case KVP_EBUSY:
		return kvpd_fail(c, rv, "%s: the pool's request limit is reached", what);
	default:
		return kvpd_fail(c, rv, "%s: %s", what, kvp_strerror(rv));
	}
}

/* The smallest block size of the pool's groups (sizes every per-group row). */
static uint32_t
min_block_size(const struct kvp_mgr *m)
{
	uint32_t bs = UINT32_MAX;
	for (uint32_t g = 0; g < kvp_mgr_num_groups(m); g++)
		if (kvp_mgr_group_spec(m, g)->block_size < bs)
			bs = kvp_mgr_group_spec(m, g)->block_size;
	return bs;
}

/* Rows of cap ids per group in one scratch array; row g at rows + g·cap. */
static int32_t *
group_rows(struct call *c, uint32_t ng, size_t cap, int32_t **row)
{
	int32_t *rows = kvpd_scratch(c, (size_t)ng * cap * sizeof(*rows) + 1);
	for (uint32_t g = 0; rows != NULL && g < ng; g++)
		row[g] = rows + (size_t)g * cap;
	return rows;
}

/* Packs each group's first n[g] ids of its row together; returns the total. */
static size_t
pack_rows(int32_t *rows, uint32_t ng, size_t cap, const size_t *n)
{
	size_t off = 0;
	for (uint32_t g = 0; g < ng; g++) {
		memmove(rows + off, rows + (size_t)g * cap, n[g] * sizeof(*rows));
		off += n[g];
	}
	return off;
}

/* Whether the request holds blocks in any group. */
static bool
holds_blocks(const struct kvp_mgr *m, uint64_t mid)
{
	for (uint32_t g = 0; g < kvp_mgr_num_groups(m); g++) {
		const int32_t *ids;
		size_t n = 0;
		if (kvp_mgr_request_blocks(m, mid, g, &ids, &n) == KVP_OK && n > 0)
			return true;
	}
	return false;
}

/* Appends the call's tokens, takes a prefix hit if the request holds no blocks, allocates. */
static int
schedule(struct call *c, const Kvpool__V1__AllocateSlotsRequest *m, uint64_t mid,
         Kvpool__V1__AllocateSlotsReply *r, Kvpool__V1__Reply *out)
{
	struct kvp_mgr *mgr = c->p->mgr;
	uint32_t ng = kvp_mgr_num_groups(mgr), mbs = min_block_size(mgr), hit = 0;
	int32_t *hit_row[KVP_MGR_MAX_GROUPS] = {NULL}, *fresh_row[KVP_MGR_MAX_GROUPS];
	size_t ntok = 0, ncomp = 0, counts[KVP_MGR_MAX_GROUPS] = {0};
	int rv;

	if (m->n_new_token_ids > 0 &&
	    (rv = mgr_status(c, kvp_mgr_append_tokens(mgr, mid, m->new_token_ids,
	                                              m->n_new_token_ids), "append tokens")))
		return rv;
	/* A request that holds no blocks (new, or preempted) takes its prefix hit. */
	if (m->use_prefix_cache && !holds_blocks(mgr, mid)) {
		(void)kvp_mgr_request_info(mgr, mid, &ntok, NULL, NULL);
		size_t cap = ntok / mbs + 1;
		if (group_rows(c, ng, cap, hit_row) == NULL)
			return kvpd_fail(c, KVP_ENOMEM, "out of memory");
		if ((rv = mgr_status(c, kvp_mgr_get_computed_blocks(mgr, mid, hit_row, cap, &hit),
		                     "lookup")))
			return rv;
	}
	(void)kvp_mgr_request_info(mgr, mid, &ntok, &ncomp, NULL);
	size_t ext = m->num_external_computed_tokens;
	/* Computed tokens can pass the known ones (draft tokens): no unsigned underflow here. */
	size_t left = ntok > ncomp + hit ? ntok - ncomp - hit : 0;
	if (ext > left)
		return kvpd_fail(c, KVP_EINVAL, "allocate_slots: %zu external tokens, but the request "
		                 "has %zu not computed after the hit", ext, left);
	uint32_t num_new = m->no_new_tokens ? 0 : m->num_new_tokens;
	if (num_new == 0 && !m->no_new_tokens) {
		size_t remaining = left - ext;
		if (m->token_budget > 0 && remaining > m->token_budget)
			remaining = m->token_budget;
		num_new = (uint32_t)remaining;
	}
	size_t need = ncomp + hit + ext + num_new + m->num_lookahead_tokens;
	/* A cross-attention group's row holds the encoder's tokens' blocks. */
	size_t rows = need > m->num_encoder_tokens ? need : m->num_encoder_tokens;
	size_t cap = rows / mbs + 2, ext_blocks[KVP_MGR_MAX_GROUPS] = {0};
	int32_t *fresh = group_rows(c, ng, cap, fresh_row);
	uint32_t *per_group = kvpd_scratch(c, 2 * ng * sizeof(*per_group));
	if (fresh == NULL || per_group == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	struct kvp_alloc_args a = {.num_new_tokens = num_new,
	                           .num_new_computed_tokens = hit,
	                           .computed_blocks = hit ? (const int32_t *const *)hit_row : NULL,
	                           .num_lookahead_tokens = m->num_lookahead_tokens,
	                           .delay_cache_blocks = m->delay_cache_blocks,
	                           .full_sequence_must_fit = m->full_sequence_must_fit,
	                           .num_external_computed_tokens = (uint32_t)ext,
	                           .num_external_blocks = ext_blocks,
	                           .num_in_flight_tokens = m->num_in_flight_tokens,
	                           .num_encoder_tokens = m->num_encoder_tokens};
	rv = kvp_mgr_allocate_slots(mgr, mid, &a, fresh_row, cap, counts);
	if (rv == KVP_EINVAL && num_new == 0 && ext == 0)
		return kvpd_fail(c, rv, "allocate_slots: nothing to schedule (every token is computed)");
	if (rv == KVP_ENOTSUP)
		return kvpd_fail(c, rv, "allocate_slots: external tokens on a pool with a Mamba align "
		                 "or cross-attention group are not supported");
	if ((rv = mgr_status(c, rv, "allocate_slots")))
		return rv;
	(void)kvp_mgr_request_info(mgr, mid, NULL, &ncomp, NULL);
	r->hit_tokens = hit;
	r->num_scheduled_tokens = num_new;
	r->num_computed_tokens = (uint32_t)ncomp;
	r->new_block_ids = fresh;
	r->n_new_block_ids = pack_rows(fresh, ng, cap, counts);
	for (uint32_t g = 0; g < ng; g++) {
		per_group[g] = (uint32_t)counts[g];
		per_group[ng + g] = (uint32_t)ext_blocks[g];
	}
	r->new_blocks_per_group = per_group;
	r->n_new_blocks_per_group = ng;
	if (ext > 0) {
		r->external_blocks_per_group = per_group + ng;
		r->n_external_blocks_per_group = ng;
	}
	out->result_case = KVPOOL__V1__REPLY__RESULT_ALLOCATE_SLOTS;
	out->allocate_slots = r;
	return KVP_OK;
}


/*
 * vLLM keeps no state for a request it could not schedule: a request this
 * call created is forgotten again if the call is refused, so the scheduler's
 * identical retry on its next step is a first call again.
 */
int
kvpd_h_allocate_slots(struct call *c, const Kvpool__V1__AllocateSlotsRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__AllocateSlotsReply *r =
		NEW(c, Kvpool__V1__AllocateSlotsReply, kvpool__v1__allocate_slots_reply__descriptor);
	uint64_t mid = kvpd_session_request(c->sess, m->request_id);
	bool created = false;
	int rv;

	/* The prompt as varints (int64) or as fixed32 ids (PoolInfo.prompt_u32): one of the two. */
	size_t nprompt = m->n_prompt_token_ids + m->n_prompt_token_ids_u32;

	if (r == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	if (m->n_prompt_token_ids > 0 && m->n_prompt_token_ids_u32 > 0)
		return kvpd_fail(c, KVP_EINVAL, "the prompt given twice: prompt_token_ids and "
		                 "prompt_token_ids_u32 (send one)");
	if (nprompt > c->p->limits.max_ids || m->n_new_token_ids > c->p->limits.max_ids ||
	    m->num_new_tokens > c->p->limits.max_ids || m->num_lookahead_tokens > c->p->limits.max_ids ||
	    m->num_external_computed_tokens > c->p->limits.max_ids ||
	    m->num_encoder_tokens > c->p->limits.max_ids)
		return kvpd_fail(c, KVP_EINVAL, "too many tokens in one call; the limit is %u",
		            c->p->limits.max_ids);
	if (mid == 0) {
		struct call_keys ck;
		const int64_t *prompt = m->prompt_token_ids;
		if (nprompt == 0)
			return kvpd_fail(c, KVP_ENOTFOUND, "no request %llu in this session (send its prompt "
			                              "to add it)", (unsigned long long)m->request_id);
		if (c->sess->reqs.n >= c->p->limits.max_session_requests) {
			c->p->counters.limit_refusals++;
			return kvpd_fail(c, KVP_EBUSY, "this session holds %zu live requests, the limit "
			                 "(max-session-requests): free one first", c->sess->reqs.n);
		}
		if ((rv = kvpd_parse_keys(c, m->keys, &ck)))
			return rv;
		if (m->n_prompt_token_ids_u32 > 0) { /* widened for the engine, which copies it */
			int64_t *w = kvpd_scratch(c, nprompt * sizeof(*w));
			if (w == NULL)
				return kvpd_fail(c, KVP_ENOMEM, "out of memory");
			for (size_t i = 0; i < nprompt; i++)
				w[i] = m->prompt_token_ids_u32[i];
			prompt = w;
		}
		struct kvp_request_desc d = {.prompt = prompt, .num_prompt = nprompt, .keys = ck.ptr,
		                             .has_lora_id = ck.has_lora_id, .lora_id = ck.lora_id};
		mid = ++c->p->next_mgr_id;
		if ((rv = mgr_status(c, kvp_mgr_add_request(c->p->mgr, mid, &d), "add request")))
			return rv;
		if (kvpd_session_add_request(c->sess, m->request_id, mid) != KVP_OK) {
			(void)kvp_mgr_free_request(c->p->mgr, mid);
			return kvpd_fail(c, KVP_ENOMEM, "out of memory");
		}
		created = true;
	} else if (nprompt > 0) {
		return kvpd_fail(c, KVP_ESTATE, "request %llu exists: send new_token_ids, not a prompt",
		            (unsigned long long)m->request_id);
	}
	if ((rv = schedule(c, m, mid, r, out)) != KVP_OK && created) {
		/* Holds no blocks: allocate_slots refuses without changing anything. */
		(void)kvp_mgr_free_request(c->p->mgr, mid);
		kvpd_session_remove_request(c->sess, m->request_id);
	}
	return rv;
}

int
kvpd_h_free_request(struct call *c, const Kvpool__V1__FreeRequestRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__FreeRequestReply *r =
		NEW(c, Kvpool__V1__FreeRequestReply, kvpool__v1__free_request_reply__descriptor);
	uint64_t mid = kvpd_session_request(c->sess, m->request_id);

	if (r == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	if (mid == 0)
		return kvpd_fail(c, KVP_ENOTFOUND, "no request %llu in this session",
		            (unsigned long long)m->request_id);
	if (m->preempt) {
		(void)kvp_mgr_preempt(c->p->mgr, mid);
	} else {
		(void)kvp_mgr_free_request(c->p->mgr, mid);
		kvpd_session_remove_request(c->sess, m->request_id);
	}
	out->result_case = KVPOOL__V1__REPLY__RESULT_FREE_REQUEST;
	out->free_request = r;
	return KVP_OK;
}

int
kvpd_h_get_computed_blocks(struct call *c, const Kvpool__V1__GetComputedBlocksRequest *m,
                      Kvpool__V1__Reply *out)
{
	Kvpool__V1__GetComputedBlocksReply *r =
		NEW(c, Kvpool__V1__GetComputedBlocksReply, kvpool__v1__get_computed_blocks_reply__descriptor);
	uint64_t mid = kvpd_session_request(c->sess, m->request_id);
	size_t ntok = 0;
	uint32_t hit = 0;
	int rv;

	if (r == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	if (mid == 0)
		return kvpd_fail(c, KVP_ENOTFOUND, "no request %llu in this session",
		            (unsigned long long)m->request_id);
	struct kvp_mgr *mgr = c->p->mgr;
	uint32_t ng = kvp_mgr_num_groups(mgr);
	int32_t *row[KVP_MGR_MAX_GROUPS];
	size_t n[KVP_MGR_MAX_GROUPS];
	(void)kvp_mgr_request_info(mgr, mid, &ntok, NULL, NULL);
	size_t cap = ntok / min_block_size(mgr) + 1;
	int32_t *hits = group_rows(c, ng, cap, row);
	if (hits == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	if ((rv = mgr_status(c, kvp_mgr_get_computed_blocks(mgr, mid, row, cap, &hit),
	                     "get_computed_blocks")))
		return rv;
	for (uint32_t g = 0; g < ng; g++)
		n[g] = hit / kvp_mgr_group_spec(mgr, g)->block_size;
	r->hit_tokens = hit;
	r->block_ids = hits;
	r->n_block_ids = pack_rows(hits, ng, cap, n);
	out->result_case = KVPOOL__V1__REPLY__RESULT_GET_COMPUTED_BLOCKS;
	out->get_computed_blocks = r;
	return KVP_OK;
}

