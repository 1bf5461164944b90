/* SPDX-License-Identifier: Apache-2.0 */
/* The request-level calls (vLLM's KVCacheManager): AllocateSlots, FreeRequest, GetComputedBlocks. */
#include "clients/c/kvpool.h"

#include <stdlib.h>
#include <string.h>

#include "clients/c/client_impl.h"

void
kvp_client_slots_from_(const Kvpool__V1__AllocateSlotsReply *s, struct kvp_client_slots_result *res)
{
	res->hit_tokens = s->hit_tokens;
	res->num_scheduled_tokens = s->num_scheduled_tokens;
	res->num_computed_tokens = s->num_computed_tokens;
	res->num_new_blocks = s->n_new_block_ids;
	res->num_groups = 0;
	for (size_t g = 0; g < s->n_new_blocks_per_group && g < KVP_MAX_GROUPS; g++)
		res->new_blocks_per_group[res->num_groups++] = s->new_blocks_per_group[g];
	for (size_t g = 0; g < KVP_MAX_GROUPS; g++)
		res->external_blocks_per_group[g] =
			g < s->n_external_blocks_per_group ? s->external_blocks_per_group[g] : 0;
}

int
kvp_client_allocate_slots(struct kvp_client *c, const struct kvp_client_slots *a,
                          int32_t *new_blocks, size_t cap, struct kvp_client_slots_result *res)
{
	Kvpool__V1__AllocateSlotsRequest m;
	Kvpool__V1__RequestKeys keys;
	Kvpool__V1__MmFeature mm[KVP_CLIENT_MAX_MM], *mmp[KVP_CLIENT_MAX_MM];
	Kvpool__V1__Reply *r = NULL;

	if (c == NULL || res == NULL || kvp_build_slots_(&m, a) != KVP_OK)
		return KVP_EINVAL;
	if (a->keys || a->has_lora_id) {
		kvp_wire_keys_to_proto(a->keys, a->has_lora_id, a->lora_id, &keys, mm, mmp);
		m.keys = &keys;
	}
	/* A daemon that reads 32-bit prompts gets one copied, not written id by id as varints. */
	uint32_t *p32 = c->plan.prompt_u32 ? kvpc_prompt_u32(m.prompt_token_ids, m.n_prompt_token_ids)
	                                   : NULL;
	if (p32 != NULL) {
		m.prompt_token_ids_u32 = p32;
		m.n_prompt_token_ids_u32 = m.n_prompt_token_ids;
		m.prompt_token_ids = NULL;
		m.n_prompt_token_ids = 0;
	}
	KVP_CLIENT_CALL(c, allocate_slots, ALLOCATE_SLOTS, &m, r);
	free(p32);
	if (rv != KVP_OK)
		return rv;
	const Kvpool__V1__AllocateSlotsReply *s = r->allocate_slots;
	if (r->result_case != KVPOOL__V1__REPLY__RESULT_ALLOCATE_SLOTS || s->n_new_block_ids > cap) {
		kvpool__v1__reply__free_unpacked(r, NULL);
		return kvp_client_fail_(c, KVP_EINVAL, "allocate_slots: more new blocks than the buffer holds",
		                        NULL);
	}
	if (s->n_new_block_ids > 0)
		memcpy(new_blocks, s->new_block_ids, s->n_new_block_ids * sizeof(*new_blocks));
	kvp_client_slots_from_(s, res);
	kvpool__v1__reply__free_unpacked(r, NULL);
	return KVP_OK;
}

int
kvp_client_free_request(struct kvp_client *c, uint64_t request_id, bool preempt)
{
	Kvpool__V1__FreeRequestRequest m = KVPOOL__V1__FREE_REQUEST_REQUEST__INIT;
	Kvpool__V1__Reply *r = NULL;

	if (c == NULL)
		return KVP_EINVAL;
	m.request_id = request_id;
	m.preempt = preempt;
	KVP_CLIENT_CALL(c, free_request, FREE_REQUEST, &m, r);
	if (rv == KVP_OK)
		kvpool__v1__reply__free_unpacked(r, NULL);
	return rv;
}

int
kvp_client_get_computed_blocks(struct kvp_client *c, uint64_t request_id, int32_t *ids,
                               size_t cap, size_t *num_ids, uint32_t *hit_tokens)
{
	Kvpool__V1__GetComputedBlocksRequest m = KVPOOL__V1__GET_COMPUTED_BLOCKS_REQUEST__INIT;
	Kvpool__V1__Reply *r = NULL;

	if (c == NULL || num_ids == NULL || hit_tokens == NULL)
		return KVP_EINVAL;
	m.request_id = request_id;
	KVP_CLIENT_CALL(c, get_computed_blocks, GET_COMPUTED_BLOCKS, &m, r);
	if (rv != KVP_OK)
		return rv;
	const Kvpool__V1__GetComputedBlocksReply *g = r->get_computed_blocks;
	if (r->result_case != KVPOOL__V1__REPLY__RESULT_GET_COMPUTED_BLOCKS || g->n_block_ids > cap) {
		kvpool__v1__reply__free_unpacked(r, NULL);
		return kvp_client_fail_(c, KVP_EINVAL, "get_computed_blocks: buffer too small", NULL);
	}
	if (g->n_block_ids > 0)
		memcpy(ids, g->block_ids, g->n_block_ids * sizeof(*ids));
	*num_ids = g->n_block_ids;
	*hit_tokens = g->hit_tokens;
	kvpool__v1__reply__free_unpacked(r, NULL);
	return KVP_OK;
}
