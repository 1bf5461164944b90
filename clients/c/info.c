/* SPDX-License-Identifier: Apache-2.0 */
/* What Hello (or a resume) told the client about its session and pool: client_impl.h. */
#include <stdio.h>
#include <string.h>

#include "clients/c/client_impl.h"
#include "proto/wire.h"

void
kvpc_copy_info(struct kvp_client *c, const Kvpool__V1__HelloReply *h)
{
	struct kvp_client_info *i = &c->info;
	const Kvpool__V1__PoolInfo *p = h->pool;

	i->session_id = h->session_id;
	i->lease_ms = h->lease_ms;
	snprintf(i->server_version, sizeof(i->server_version), "%s",
	         h->server_version ? h->server_version : "");
	if (p == NULL)
		return;
	snprintf(i->pool, sizeof(i->pool), "%s", p->name);
	i->num_blocks = p->num_blocks;
	i->hash_block_size = p->hash_block_size;
	i->block_size = p->n_groups > 0 ? p->groups[0]->block_size : p->hash_block_size;
	i->prefix_caching = p->prefix_caching;
	i->num_groups = 0;
	for (size_t g = 0; g < p->n_groups && g < KVP_MAX_GROUPS; g++) {
		const Kvpool__V1__GroupInfo *gi = p->groups[g];
		struct kvp_group_spec *s = &i->groups[i->num_groups++];
		memset(s, 0, sizeof(*s));
		if (kvp_group_kind_parse(gi->kind, &s->kind) != KVP_OK)
			s->kind = KVP_GROUP_NUM_KINDS; /* a kind this client does not know */
		s->block_size = gi->block_size;
		s->window = gi->sliding_window ? gi->sliding_window : gi->attention_chunk_size;
		(void)kvp_mamba_mode_parse(gi->mamba_cache_mode, &s->mamba_mode);
	}
	snprintf(i->hash_algorithm, sizeof(i->hash_algorithm), "%s", p->hash_algorithm);
	if (p->none_hash_fingerprint.len > 0) /* data is NULL when the field is absent */
		memcpy(i->none_hash_fingerprint, p->none_hash_fingerprint.data,
		       p->none_hash_fingerprint.len < 8 ? p->none_hash_fingerprint.len : 8);
	snprintf(i->medium, sizeof(i->medium), "%s", p->medium);
	i->event_epoch = p->event_epoch;
	i->event_seq = p->event_seq;
	c->has_event_key = p->event_key.len == KVP_SEAL_KEY_LEN && p->event_key_id != 0;
	if (c->has_event_key) {
		memcpy(c->event_key.key, p->event_key.data, KVP_SEAL_KEY_LEN);
		c->event_key.id = p->event_key_id;
	}
	i->max_model_len = p->max_model_len;
	i->max_ids_per_call = p->max_ids_per_call;
	i->max_hash_len = p->max_hash_len;
	i->hash_len = p->hash_len ? p->hash_len : KVP_HASH_LEN; /* absent before xxhash: 32 */
	c->slots_runs = p->slots_runs;
	c->plan.prompt_u32 = p->prompt_u32; /* Batch prompts as 32-bit ids (request_pack.h) */
	i->max_msg_bytes = p->max_msg_bytes;
	memset(&i->executor, 0, sizeof(i->executor));
	i->region = false;
	if (p->executor != NULL) {
		const Kvpool__V1__ExecutorInfo *x = p->executor;
		struct kvp_client_executor *e = &i->executor;
		snprintf(e->backend, sizeof(e->backend), "%s", x->backend);
		e->num_layers = x->num_layers;
		e->num_heads = x->num_heads;
		e->head_size = x->head_size;
		snprintf(e->dtype, sizeof(e->dtype), "%s", x->dtype);
		snprintf(e->layout, sizeof(e->layout), "%s", x->layout);
		e->block_size = x->block_size;
		e->block_bytes = x->block_bytes;
		e->memory_bytes = x->memory_bytes;
		i->region = x->region;
	}
}
