/* SPDX-License-Identifier: Apache-2.0 */
#include "engine/mgr_request.h"

#include <stdlib.h>
#include <string.h>

#include "common/kvp_status.h"

void
kvp_mreq_table_insert(struct kvp_mreq_table *m, struct kvp_mreq *r)
{
	uint32_t i = kvp_mreq_id_hash(r->id) & m->mask;
	while (m->slots[i] != NULL)
		i = (i + 1) & m->mask;
	m->slots[i] = r;
	m->count++;
}

void
kvp_mreq_table_remove(struct kvp_mreq_table *m, uint64_t id)
{
	uint32_t i = kvp_mreq_id_hash(id) & m->mask, j;

	while (m->slots[i]->id != id)
		i = (i + 1) & m->mask;
	for (j = i;;) {
		j = (j + 1) & m->mask;
		if (m->slots[j] == NULL)
			break;
		uint32_t home = kvp_mreq_id_hash(m->slots[j]->id) & m->mask;
		int stays = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
		if (!stays) {
			m->slots[i] = m->slots[j];
			i = j;
		}
	}
	m->slots[i] = NULL;
	m->count--;
}

void
kvp_mreq_destroy(struct kvp_mreq *r)
{
	if (r == NULL)
		return;
	for (int g = 0; g < KVP_MGR_MAX_GROUPS; g++)
		free(r->groups[g].ids);
	free(r->tokens);
	free(r->hashes);
	free(r->strings);
	free(r->mm);
	free(r);
}

static int
copy_keys(struct kvp_mreq *r, const struct kvp_request_keys *k)
{
	size_t total = 0;
	char *s;

	if (k == NULL)
		return KVP_OK;
	total += k->lora_name ? strlen(k->lora_name) + 1 : 0;
	total += k->lora_path ? strlen(k->lora_path) + 1 : 0;
	total += k->cache_salt ? strlen(k->cache_salt) + 1 : 0;
	total += k->session_id ? strlen(k->session_id) + 1 : 0;
	for (size_t i = 0; i < k->num_mm; i++)
		total += strlen(k->mm[i].identifier) + 1;
	if ((r->strings = s = malloc(total ? total : 1)) == NULL)
		return KVP_ENOMEM;
	if (k->num_mm && (r->mm = malloc(k->num_mm * sizeof(*r->mm))) == NULL)
		return KVP_ENOMEM;
#define DUP(dst, src)                                  \
	do {                                           \
		size_t l_ = strlen(src) + 1;           \
		memcpy(s, (src), l_);                  \
		(dst) = s;                             \
		s += l_;                               \
	} while (0)
	if (k->lora_name)
		DUP(r->keys.lora_name, k->lora_name);
	if (k->lora_path)
		DUP(r->keys.lora_path, k->lora_path);
	if (k->cache_salt)
		DUP(r->keys.cache_salt, k->cache_salt);
	if (k->session_id)
		DUP(r->keys.session_id, k->session_id);
	for (size_t i = 0; i < k->num_mm; i++) {
		r->mm[i] = k->mm[i];
		DUP(r->mm[i].identifier, k->mm[i].identifier);
	}
#undef DUP
	r->keys.mm = r->mm;
	r->keys.num_mm = k->num_mm;
	r->has_keys = true;
	return KVP_OK;
}

int
kvp_mreq_create(uint64_t id, const struct kvp_request_keys *keys, struct kvp_mreq **out)
{
	struct kvp_mreq *r;
	int rv;

	if ((r = calloc(1, sizeof(*r))) == NULL)
		return KVP_ENOMEM;
	r->id = id;
	for (int g = 0; g < KVP_MGR_MAX_GROUPS; g++)
		kvp_grp_blocks_reset(&r->groups[g]);
	if ((rv = copy_keys(r, keys)) != KVP_OK) {
		kvp_mreq_destroy(r);
		return rv;
	}
	*out = r;
	return KVP_OK;
}

const struct kvp_request_keys *
kvp_mreq_keys(const struct kvp_mreq *r)
{
	return r->has_keys ? &r->keys : NULL;
}

int
kvp_mreq_table_init(struct kvp_mreq_table *t, uint32_t max)
{
	uint64_t nslots = 16;

	if (max == 0 || max > (1u << 30))
		return KVP_EINVAL;
	while (nslots < 2ull * max)
		nslots <<= 1;
	if ((t->slots = calloc(nslots, sizeof(*t->slots))) == NULL)
		return KVP_ENOMEM;
	t->mask = (uint32_t)(nslots - 1);
	t->count = 0;
	return KVP_OK;
}

void
kvp_mreq_table_fini(struct kvp_mreq_table *t)
{
	free(t->slots);
	t->slots = NULL;
}
