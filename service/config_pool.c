/* SPDX-License-Identifier: Apache-2.0 */
/* A pool's KV cache groups in its spec: parsed, defaulted as vLLM does, checked. */
#include <stdio.h>
#include <string.h>

#include "common/kvp_status.h"
#include "service/config.h"
#include "service/config_impl.h"

int
kvpd_cfg_parse_groups(struct kvpd_pool_config *p, const char *v, FILE *err)
{
	char why[200];
	size_t n = 0;

	if (kvp_group_specs_parse(v, p->groups, KVP_MAX_GROUPS, &n, why, sizeof(why)) != KVP_OK) {
		fprintf(err, "kvpoold: pool %s: groups=%s: %s\n", p->name[0] ? p->name : "(unnamed)",
		        v ? v : "", why);
		return -1;
	}
	p->num_groups = (uint32_t)n;
	return 0;
}

int
kvpd_cfg_resolve_groups(struct kvpd_pool_config *p, FILE *err)
{
	char why[200];

	if (p->num_groups == 0) {
		if (p->block_size == 0)
			p->block_size = 16;
		p->groups[0] = (struct kvp_group_spec){.kind = KVP_GROUP_FULL,
		                                       .block_size = p->block_size};
		p->num_groups = 1;
	}
	uint32_t largest = 0;
	for (uint32_t i = 0; i < p->num_groups; i++)
		if (p->groups[i].block_size > largest)
			largest = p->groups[i].block_size;
	/* The executor's blocks hold the largest group's tokens. */
	if (p->block_size == 0)
		p->block_size = largest;
	if (p->hash_block_size == 0)
		p->hash_block_size = kvp_group_specs_hash_block_size(p->groups, p->num_groups);
	kvp_group_specs_resolve(p->groups, p->num_groups, p->caching);
	if (kvp_group_specs_validate(p->groups, p->num_groups, p->hash_block_size, p->caching, why,
	                             sizeof(why)) != KVP_OK) {
		fprintf(err, "kvpoold: pool %s: %s\n", p->name, why);
		return -1;
	}
	for (uint32_t i = 0; p->caching && i < p->num_groups; i++)
		if (p->groups[i].block_size / p->hash_block_size > 32) {
			fprintf(err, "kvpoold: pool %s: group %u's block size is %u hash blocks; at "
			             "most 32 (a coarse hash is at most 1024 bytes)\n",
			        p->name, i, p->groups[i].block_size / p->hash_block_size);
			return -1;
		}
	if (p->block_size < largest) {
		fprintf(err, "kvpoold: pool %s: block_size %u is smaller than a group's block size "
		             "(%u); the executor's blocks must hold every group's\n",
		        p->name, p->block_size, largest);
		return -1;
	}
	return 0;
}
