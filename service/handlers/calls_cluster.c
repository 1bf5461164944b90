/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ClusterFill: the cluster tier's agent reports the keys the cluster lacks
 * and takes the keys lookups missed (fill.h has the table, docs/cluster.md
 * the tier). The agent fills a key with the region calls every writer uses
 * (Reserve, Commit), so nothing here touches rows. It also tells what the
 * cluster store holds, which the pool publishes as medium CLUSTER events.
 */
#include "common/kvp_status.h"
#include "common/map_key.h"
#include "engine/pool.h"
#include "service/rpc/call.h"

/* A key list of the request: KVP_OK with its count, or a failed call. */
static int
key_count(struct call *c, const char *what, const ProtobufCBinaryData *keys, size_t kl,
          size_t *n)
{
	if (keys->len % kl != 0)
		return kvpd_fail(c, KVP_EINVAL, "%s keys of %zu bytes: not a multiple of %zu (a "
		                 "%u-byte hash and a 4-byte group each)", what, keys->len, kl,
		                 kvp_pool_hash_len(c->p->pool));
	if (keys->len / kl > c->p->limits.max_ids)
		return kvpd_fail(c, KVP_EINVAL, "%zu %s keys in one call; the limit is %u",
		                 keys->len / kl, what, c->p->limits.max_ids);
	*n = keys->len / kl;
	return KVP_OK;
}

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
	size_t n_absent = 0, n_stored = 0, n_removed = 0;
	int rv;
	if ((rv = key_count(c, "absent", &m->absent_keys, kl, &n_absent)) != KVP_OK ||
	    (rv = key_count(c, "stored", &m->stored_keys, kl, &n_stored)) != KVP_OK ||
	    (rv = key_count(c, "removed", &m->removed_keys, kl, &n_removed)) != KVP_OK)
		return rv;
	max = m->max_wants < c->p->limits.max_ids ? m->max_wants : c->p->limits.max_ids;
	r = NEW(c, Kvpool__V1__ClusterFillReply, kvpool__v1__cluster_fill_reply__descriptor);
	keys = kvpd_scratch(c, max * kl + 1);
	if (r == NULL || keys == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	if (n_stored > 0 || n_removed > 0) {
		uint32_t bs[KVP_MAX_GROUPS];
		for (uint32_t g = 0; g < c->p->cfg.num_groups; g++)
			bs[g] = c->p->cfg.groups[g].block_size;
		if ((rv = kvp_pool_announce(c->p->pool, true, m->stored_keys.data, kl, n_stored,
		                            KVP_MEDIUM_CLUSTER, bs, c->p->cfg.num_groups)) != KVP_OK ||
		    (rv = kvp_pool_announce(c->p->pool, false, m->removed_keys.data, kl, n_removed,
		                            KVP_MEDIUM_CLUSTER, bs, c->p->cfg.num_groups)) != KVP_OK)
			return kvpd_fail(c, rv, "cannot queue the cluster's events (out of memory)");
	}
	size_t n = 0;
	/* A call that only tells events is not the fill loop's: it keeps no
	 * agent alive, so lookups are not answered pending for a dead fill. */
	if (n_absent > 0 || m->max_wants > 0 || (n_stored == 0 && n_removed == 0))
		n = kvpd_fill_agent(f, m->absent_keys.data, n_absent, keys, max, &waiting,
		                    c->now_ms);
	r->wanted_keys.data = keys;
	r->wanted_keys.len = n * kl;
	r->waiting = waiting;
	out->result_case = KVPOOL__V1__REPLY__RESULT_CLUSTER_FILL;
	out->cluster_fill = r;
	return KVP_OK;
}
