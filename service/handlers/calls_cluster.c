/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ClusterFill: the cluster tier's agent reports the keys the cluster lacks
 * and takes the keys lookups missed (fill.h has the table, docs/cluster.md
 * the tier). The agent fills a key with the region calls every writer uses
 * (Reserve, Commit), so nothing here touches rows.
 */
#include "common/kvp_status.h"
#include "common/map_key.h"
#include "engine/pool.h"
#include "service/rpc/call.h"

int
kvpd_h_cluster_fill(struct call *c, const Kvpool__V1__ClusterFillRequest *m,
                    Kvpool__V1__Reply *out)
{
	struct kvpd_fill *f = &c->p->fill;
	Kvpool__V1__ClusterFillReply *r;
	size_t kl, max;
	uint8_t *keys;
	uint32_t waiting = 0;

	if (f->key_len == 0)
		return kvpd_fail(c, KVP_ENOTSUP, "pool %s has no cluster tier (it needs a shared "
		                 "region and cluster_wait_ms > 0)", c->p->cfg.name);
	kl = f->key_len;
	if (m->absent_keys.len % kl != 0)
		return kvpd_fail(c, KVP_EINVAL, "absent keys of %zu bytes: not a multiple of %zu (a "
		                 "%u-byte hash and a 4-byte group each)", m->absent_keys.len, kl,
		                 kvp_pool_hash_len(c->p->pool));
	if (m->absent_keys.len / kl > c->p->limits.max_ids)
		return kvpd_fail(c, KVP_EINVAL, "%zu absent keys in one call; the limit is %u",
		                 m->absent_keys.len / kl, c->p->limits.max_ids);
	max = m->max_wants < c->p->limits.max_ids ? m->max_wants : c->p->limits.max_ids;
	r = NEW(c, Kvpool__V1__ClusterFillReply, kvpool__v1__cluster_fill_reply__descriptor);
	keys = kvpd_scratch(c, max * kl + 1);
	if (r == NULL || keys == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	size_t n = kvpd_fill_agent(f, m->absent_keys.data, m->absent_keys.len / kl, keys, max,
	                           &waiting, c->now_ms);
	r->wanted_keys.data = keys;
	r->wanted_keys.len = n * kl;
	r->waiting = waiting;
	out->result_case = KVPOOL__V1__REPLY__RESULT_CLUSTER_FILL;
	out->cluster_fill = r;
	return KVP_OK;
}
