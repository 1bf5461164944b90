/* SPDX-License-Identifier: Apache-2.0 */
/* Request-level calls: vLLM's KVCacheManager over the wire. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service/call.h"
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

/* Appends the call's tokens, takes a prefix hit if the request holds no blocks, allocates. */
static int
schedule(struct call *c, const Kvpool__V1__AllocateSlotsRequest *m, uint64_t mid,
         Kvpool__V1__AllocateSlotsReply *r, Kvpool__V1__Reply *out)
{
	int rv;

	if (m->n_new_token_ids > 0 &&
	    (rv = mgr_status(c, kvp_mgr_append_tokens(c->p->mgr, mid, m->new_token_ids,
	                                              m->n_new_token_ids), "append tokens")))
		return rv;
	/* A request that holds no blocks (new, or preempted) takes its prefix hit. */
	const int32_t *held;
	size_t nheld = 0;
	uint32_t hit = 0;
	int32_t *hits = NULL;
	(void)kvp_mgr_request_blocks(c->p->mgr, mid, 0, &held, &nheld);
	if (m->use_prefix_cache && nheld == 0) {
		size_t ntok = 0;
		(void)kvp_mgr_request_info(c->p->mgr, mid, &ntok, NULL, NULL);
		size_t cap = ntok / c->p->cfg.block_size + 1;
		if ((hits = kvpd_scratch(c, cap * sizeof(*hits))) == NULL)
			return kvpd_fail(c, KVP_ENOMEM, "out of memory");
		int32_t *const hit_out[] = {hits};
		if ((rv = mgr_status(c, kvp_mgr_get_computed_blocks(c->p->mgr, mid, hit_out, cap, &hit),
		                     "lookup")))
			return rv;
	}
	size_t ntok = 0, ncomp = 0;
	(void)kvp_mgr_request_info(c->p->mgr, mid, &ntok, &ncomp, NULL);
	uint32_t num_new = m->num_new_tokens;
	if (num_new == 0) {
		size_t remaining = ntok > ncomp + hit ? ntok - ncomp - hit : 0;
		if (m->token_budget > 0 && remaining > m->token_budget)
			remaining = m->token_budget;
		num_new = (uint32_t)remaining;
	}
	size_t need = ncomp + hit + num_new + m->num_lookahead_tokens;
	size_t cap = need / c->p->cfg.block_size + 2;
	int32_t *fresh = kvpd_scratch(c, cap * sizeof(*fresh));
	uint32_t *per_group = kvpd_scratch(c, sizeof(*per_group));
	if (fresh == NULL || per_group == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	int32_t *const fresh_out[] = {fresh};
	const int32_t *const hit_in[] = {hits};
	size_t count = 0;
	struct kvp_alloc_args a = {.num_new_tokens = num_new,
	                           .num_new_computed_tokens = hit,
	                           .computed_blocks = hit ? hit_in : NULL,
	                           .num_lookahead_tokens = m->num_lookahead_tokens,
	                           .delay_cache_blocks = m->delay_cache_blocks};
	rv = kvp_mgr_allocate_slots(c->p->mgr, mid, &a, fresh_out, cap, &count);
	if (rv == KVP_EINVAL && num_new == 0)
		return kvpd_fail(c, rv, "allocate_slots: nothing to schedule (every token is computed)");
	if ((rv = mgr_status(c, rv, "allocate_slots")))
		return rv;
	(void)kvp_mgr_request_info(c->p->mgr, mid, NULL, &ncomp, NULL);
	r->hit_tokens = hit;
	r->num_scheduled_tokens = num_new;
	r->num_computed_tokens = (uint32_t)ncomp;
	r->new_block_ids = fresh;
	r->n_new_block_ids = count;
	per_group[0] = (uint32_t)count;
	r->new_blocks_per_group = per_group;
	r->n_new_blocks_per_group = 1;
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

	if (r == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	if (m->n_prompt_token_ids > c->p->limits.max_ids || m->n_new_token_ids > c->p->limits.max_ids ||
	    m->num_new_tokens > c->p->limits.max_ids || m->num_lookahead_tokens > c->p->limits.max_ids)
		return kvpd_fail(c, KVP_EINVAL, "too many tokens in one call; the limit is %u",
		            c->p->limits.max_ids);
	if (mid == 0) {
		struct call_keys ck;
		if (m->n_prompt_token_ids == 0)
			return kvpd_fail(c, KVP_ENOTFOUND, "no request %llu in this session (send its prompt "
			                              "to add it)", (unsigned long long)m->request_id);
		if ((rv = kvpd_parse_keys(c, m->keys, &ck)))
			return rv;
		struct kvp_request_desc d = {.prompt = m->prompt_token_ids,
		                             .num_prompt = m->n_prompt_token_ids, .keys = ck.ptr,
		                             .has_lora_id = ck.has_lora_id, .lora_id = ck.lora_id};
		mid = ++c->p->next_mgr_id;
		if ((rv = mgr_status(c, kvp_mgr_add_request(c->p->mgr, mid, &d), "add request")))
			return rv;
		if (kvpd_session_add_request(c->sess, m->request_id, mid) != KVP_OK) {
			(void)kvp_mgr_free_request(c->p->mgr, mid);
			return kvpd_fail(c, KVP_ENOMEM, "out of memory");
		}
		created = true;
	} else if (m->n_prompt_token_ids > 0) {
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
	(void)kvp_mgr_request_info(c->p->mgr, mid, &ntok, NULL, NULL);
	size_t cap = ntok / c->p->cfg.block_size + 1;
	int32_t *hits = kvpd_scratch(c, cap * sizeof(*hits));
	if (hits == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	int32_t *const hit_out[] = {hits};
	if ((rv = mgr_status(c, kvp_mgr_get_computed_blocks(c->p->mgr, mid, hit_out, cap, &hit),
	                     "get_computed_blocks")))
		return rv;
	r->hit_tokens = hit;
	r->block_ids = hits;
	r->n_block_ids = hit / c->p->cfg.block_size;
	out->result_case = KVPOOL__V1__REPLY__RESULT_GET_COMPUTED_BLOCKS;
	out->get_computed_blocks = r;
	return KVP_OK;
}

