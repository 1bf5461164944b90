/* SPDX-License-Identifier: Apache-2.0 */
/*
 * One request builder per call that carries more than ids, shared by the
 * direct calls (blocks.c, requests.c) and the batch (batch.c), so a field
 * cannot reach one path and not the other. Each fills its message from the
 * caller's arguments by reference; the batch then copies what it must own.
 * Request keys are the caller's to convert (on the stack for a direct call,
 * in the batch's arena for a batch).
 */
#include "clients/c/client_impl.h"

/* The width of a call's hashes: its own, or the default for where it is sent. */
static int
hash_width(uint32_t given, uint32_t dflt, size_t *out)
{
	uint32_t w = given ? given : dflt;
	if (w != KVP_HASH_LEN && w != KVP_HASH_MIN_LEN)
		return KVP_EINVAL;
	*out = w;
	return KVP_OK;
}

int
kvp_build_cache_(Kvpool__V1__CacheRequest *m, const struct kvp_client_cache *a, uint32_t dflt)
{
	size_t hl;
	if (a == NULL || (a->block_ids == NULL && a->num_block_ids > 0) ||
	    (a->keys && a->keys->num_mm > KVP_CLIENT_MAX_MM) ||
	    hash_width(a->hash_len, dflt, &hl) != KVP_OK)
		return KVP_EINVAL;
	kvpool__v1__cache_request__init(m);
	m->block_ids = (int32_t *)a->block_ids;
	m->n_block_ids = a->num_block_ids;
	m->num_cached_blocks = a->num_cached_blocks;
	m->num_full_blocks = a->num_full_blocks;
	m->group_id = a->group_id;
	m->block_size = a->block_size;
	m->block_hashes.data = (uint8_t *)a->hashes;
	m->block_hashes.len = a->hashes ? a->num_hashes * hl : 0;
	m->token_ids = (int64_t *)a->tokens;
	m->n_token_ids = a->tokens ? a->num_tokens : 0;
	m->parent_hash.data = (uint8_t *)a->parent_hash;
	m->parent_hash.len = a->parent_hash ? hl : 0;
	if (a->block_mask != NULL) {
		if (a->num_full_blocks < a->num_cached_blocks)
			return KVP_EINVAL;
		m->block_mask.data = (uint8_t *)a->block_mask;
		m->block_mask.len = a->num_full_blocks - a->num_cached_blocks;
	}
	return KVP_OK;
}

int
kvp_build_lookup_(Kvpool__V1__LookupRequest *m, const struct kvp_client_lookup *q, uint32_t dflt)
{
	size_t hl;
	if (q == NULL || (q->keys && q->keys->num_mm > KVP_CLIENT_MAX_MM) ||
	    hash_width(q->hash_len, dflt, &hl) != KVP_OK)
		return KVP_EINVAL;
	kvpool__v1__lookup_request__init(m);
	m->block_hashes.data = (uint8_t *)q->hashes;
	m->block_hashes.len = q->hashes ? q->num_hashes * hl : 0;
	m->token_ids = (int64_t *)q->tokens;
	m->n_token_ids = q->tokens ? q->num_tokens : 0;
	m->group_ids = (uint32_t *)q->group_ids;
	m->n_group_ids = q->group_ids ? q->num_groups : 0;
	m->block_size = q->block_size;
	return KVP_OK;
}

int
kvp_build_slots_(Kvpool__V1__AllocateSlotsRequest *m, const struct kvp_client_slots *a)
{
	if (a == NULL || (a->keys && a->keys->num_mm > KVP_CLIENT_MAX_MM))
		return KVP_EINVAL;
	kvpool__v1__allocate_slots_request__init(m);
	m->request_id = a->request_id;
	m->prompt_token_ids = (int64_t *)a->prompt;
	m->n_prompt_token_ids = a->prompt ? a->num_prompt : 0;
	m->new_token_ids = (int64_t *)a->new_tokens;
	m->n_new_token_ids = a->new_tokens ? a->num_new_token_ids : 0;
	m->num_new_tokens = a->num_new_tokens;
	m->token_budget = a->token_budget;
	m->num_lookahead_tokens = a->num_lookahead_tokens;
	m->use_prefix_cache = a->use_prefix_cache;
	m->delay_cache_blocks = a->delay_cache_blocks;
	m->full_sequence_must_fit = a->full_sequence_must_fit;
	m->num_external_computed_tokens = a->num_external_computed_tokens;
	m->no_new_tokens = a->no_new_tokens;
	m->num_in_flight_tokens = a->num_in_flight_tokens;
	m->num_encoder_tokens = a->num_encoder_tokens;
	return KVP_OK;
}
