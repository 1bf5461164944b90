/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The shared region and its calls by key (kvpool.proto, "the shared
 * region"): Region names the file same-host clients map; Reserve, Commit
 * and Abort store rows two-phase; LookupAndLock and Unlock lease them for
 * reading. The engine decides (pool.h, "Keyed stores"); this file checks
 * the call, keeps the session's references and the rows' checksums.
 *
 * A reserved row and a lock are each one reference this session holds, so
 * a session that ends (Goodbye, a lost lease) releases them like any other:
 * an uncommitted row's key is dropped with its last reference.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/crc32c.h"
#include "common/kvp_status.h"
#include "common/map_key.h"
#include "engine/pool.h"
#include "gpu/executor.h"
#include "service/rpc/call.h"
#include "service/rpc/disk.h"
#include "service/rpc/keep.h"

/* The pool has a region: KVP_OK, or NOT_SUPPORTED saying why not. */
static int
has_region(struct call *c)
{
	if (c->p->row_crc == NULL)
		return kvpd_fail(c, KVP_ENOTSUP,
		                 "pool %s has no shared region (it needs executor=cpu and prefix "
		                 "caching, and a --region-dir)", c->p->cfg.name);
	return KVP_OK;
}

/* Whether this session may hold n more region rows (the pool's session_rows). */
static int
room_for_rows(struct call *c, size_t n)
{
	uint64_t mine = c->sess->rows, quota = c->p->limits.session_rows;
	if (mine + n <= quota)
		return KVP_OK;
	c->p->counters.quota_refusals++;
	return kvpd_fail(c, KVP_EQUOTA, "this session holds %llu rows reserved or locked; %zu more "
	                 "would pass its quota of %llu (the pool's session_rows): commit, abort or "
	                 "unlock some first", (unsigned long long)mine, n,
	                 (unsigned long long)quota);
}

/* n of this session's region rows released (never below 0: a Free of a row by id is not seen). */
static void
rows_released(struct call *c, size_t n)
{
	c->sess->rows -= n < c->sess->rows ? n : c->sess->rows;
}

static size_t
key_len(struct call *c)
{
	return kvp_pool_hash_len(c->p->pool) + KVP_MAP_KEY_GROUP_LEN;
}

/* A key list: a whole number of keys, at most max-ids; *n gets the count. */
static int
check_keys(struct call *c, ProtobufCBinaryData k, size_t *n)
{
	size_t kl = key_len(c);
	int rv;
	if ((rv = has_region(c)))
		return rv;
	if (k.len % kl != 0)
		return kvpd_fail(c, KVP_EINVAL, "keys of %zu bytes: not a multiple of %zu (a %u-byte "
		                 "hash and a 4-byte group each)", k.len, kl,
		                 kvp_pool_hash_len(c->p->pool));
	if (k.len / kl > c->p->limits.max_ids)
		return kvpd_fail(c, KVP_EINVAL, "%zu keys in one call; the limit is %u", k.len / kl,
		                 c->p->limits.max_ids);
	*n = k.len / kl;
	return KVP_OK;
}

static const unsigned char *
row(struct call *c, int32_t id)
{
	struct kvp_exec_region r;
	if (kvp_exec_region(c->p->exec, &r) != KVP_OK)
		return NULL;
	return r.base + (uint64_t)id * r.row_stride;
}

int
kvpd_h_region(struct call *c, const Kvpool__V1__RegionRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__RegionReply *r;
	struct kvp_exec_region reg;
	int rv;

	(void)m;
	if ((rv = has_region(c)) || (rv = kvp_exec_region(c->p->exec, &reg)))
		return rv ? rv : kvpd_fail(c, KVP_EINTERNAL, "region lost");
	if ((r = NEW(c, Kvpool__V1__RegionReply, kvpool__v1__region_reply__descriptor)) == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	r->path = (char *)reg.path;
	r->bytes = reg.bytes;
	r->row_bytes = reg.row_bytes;
	r->row_stride = reg.row_stride;
	r->num_rows = reg.num_rows;
	r->shards = c->p->cfg.shards ? c->p->cfg.shards : 1;
	r->shard_bytes = reg.row_bytes / r->shards;
	out->result_case = KVPOOL__V1__REPLY__RESULT_REGION;
	out->region = r;
	return KVP_OK;
}

int
kvpd_h_reserve(struct call *c, const Kvpool__V1__ReserveRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__ReserveReply *r;
	size_t n = 0, kl = key_len(c), ne = 0;
	int32_t *ids;
	uint8_t *ev;
	int rv;

	if ((rv = check_keys(c, m->keys, &n)) || (rv = room_for_rows(c, n)) ||
	    (rv = kvpd_room_for_refs(c, n)))
		return rv;
	r = NEW(c, Kvpool__V1__ReserveReply, kvpool__v1__reserve_reply__descriptor);
	ids = kvpd_scratch(c, (n + 1) * sizeof(*ids));
	ev = kvpd_scratch(c, n * kl + 1);
	if (r == NULL || ids == NULL || ev == NULL || kvpd_session_reserve(c->sess, n) != KVP_OK)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	rv = kvp_pool_reserve(c->p->pool, m->keys.data, kl, n, ids, ev, &ne);
	if (rv == KVP_ENOSPACE)
		return kvpd_fail(c, rv, "%zu keys, %u rows free (locked and reserved rows are not "
		                 "evictable): nothing reserved", n, kvp_pool_num_free(c->p->pool));
	if (rv != KVP_OK)
		return kvpd_fail(c, rv, "reserve: %s", kvp_strerror(rv));
	for (size_t i = 0; i < n; i++)
		if (ids[i] > 0) {
			kvpd_session_add(c->sess, ids[i]);
			c->sess->rows++;
		}
	r->rows = ids;
	r->n_rows = n;
	r->evicted_keys.data = ev;
	r->evicted_keys.len = ne * kl;
	out->result_case = KVPOOL__V1__REPLY__RESULT_RESERVE;
	out->reserve = r;
	return KVP_OK;
}

/*
 * Commit's and Abort's keys: each one's reserved row, which this session must
 * hold. KVP_OK with *n keys and their rows in *ids (scratch), or the failure.
 */
static int
reserved_rows(struct call *c, ProtobufCBinaryData keys, size_t *n, int32_t **ids_out)
{
	size_t kl = key_len(c);
	int32_t *ids;
	int rv;

	if ((rv = check_keys(c, keys, n)))
		return rv;
	if ((ids = *ids_out = kvpd_scratch(c, (*n + 1) * sizeof(*ids))) == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	for (size_t i = 0; i < *n; i++) {
		ids[i] = kvp_pool_pending_block(c->p->pool, keys.data + i * kl, kl);
		if (ids[i] < 0)
			return kvpd_fail(c, KVP_ENOTFOUND, "key %zu is not reserved (committed, aborted, "
			                 "or its session ended)", i);
		if (kvpd_session_held(c->sess, ids[i]) == 0)
			return kvpd_fail(c, KVP_ENOTOWNER, "key %zu is reserved by another session", i);
	}
	return KVP_OK;
}

int
kvpd_h_commit(struct call *c, const Kvpool__V1__CommitRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__CommitReply *r;
	uint32_t bs[KVP_MAX_GROUPS];
	size_t n = 0;
	int32_t *ids;
	int rv;

	if ((rv = reserved_rows(c, m->keys, &n, &ids)))
		return rv;
	if (m->n_crc32c != 0 && m->n_crc32c != n)
		return kvpd_fail(c, KVP_EINVAL, "%zu checksums for %zu keys", m->n_crc32c, n);
	if ((r = NEW(c, Kvpool__V1__CommitReply, kvpool__v1__commit_reply__descriptor)) == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	for (uint32_t g = 0; g < c->p->cfg.num_groups; g++)
		bs[g] = c->p->cfg.groups[g].block_size;
	/* Checksums taken before the lock count if the keys still name those rows. */
	const struct kvpd_precomputed *pre = c->pre;
	if (pre != NULL && (pre->n != n || memcmp(pre->ids, ids, n * sizeof(*ids)) != 0))
		pre = NULL;
	/* The engine refuses a key named twice before it changes anything. */
	rv = kvp_pool_commit(c->p->pool, ids, n, bs, c->p->cfg.num_groups);
	if (rv != KVP_OK)
		return kvpd_fail(c, rv, rv == KVP_EINVAL ? "a key named twice" : "commit: %s",
		                 kvp_strerror(rv));
	rows_released(c, n);
	for (size_t i = 0; i < n; i++) {
		kvpd_session_remove(c->sess, ids[i]);
		c->p->row_hits[ids[i]] = 0;
		/* Read from the mapping after the writer is done: what a reader can check. */
		c->p->row_crc[ids[i]] = m->n_crc32c ? m->crc32c[i]
		                        : m->no_checksum ? 0
		                        : pre ? pre->crcs[i]
		                              : kvp_crc32c(0, row(c, ids[i]),
		                                           kvp_exec_block_bytes(c->p->exec));
		kvpd_keep_commit(c->p->keep, ids[i], m->keys.data + i * key_len(c), key_len(c),
		                 c->p->row_crc[ids[i]]);
		kvpd_disk_commit(c->p->disk, ids[i], m->keys.data + i * key_len(c), key_len(c));
		kvpd_fill_forget(&c->p->fill, m->keys.data + i * key_len(c));
	}
	r->num_committed = (uint32_t)n;
	out->result_case = KVPOOL__V1__REPLY__RESULT_COMMIT;
	out->commit = r;
	return KVP_OK;
}

int
kvpd_h_abort(struct call *c, const Kvpool__V1__AbortRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__AbortReply *r;
	size_t n = 0;
	int32_t *ids;
	int rv;

	if ((rv = reserved_rows(c, m->keys, &n, &ids)))
		return rv;
	if ((r = NEW(c, Kvpool__V1__AbortReply, kvpool__v1__abort_reply__descriptor)) == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	if ((rv = kvp_pool_abort(c->p->pool, ids, n)) != KVP_OK)
		return kvpd_fail(c, rv, rv == KVP_EINVAL ? "a key named twice" : "abort: %s",
		                 kvp_strerror(rv));
	for (size_t i = 0; i < n; i++)
		kvpd_session_remove(c->sess, ids[i]);
	rows_released(c, n);
	out->result_case = KVPOOL__V1__REPLY__RESULT_ABORT;
	out->abort = r;
	return KVP_OK;
}

static int
cmp_id(const void *a, const void *b)
{
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	return (x > y) - (x < y);
}

/* The cached row of key i, or -1. */
static int32_t
cached_row(struct call *c, const uint8_t *keys, size_t i)
{
	size_t kl = key_len(c), hl = kl - KVP_MAP_KEY_GROUP_LEN;
	const uint8_t *k = keys + i * kl;
	uint32_t g = kvp_map_key_group(k, kl);
	int32_t id = -1;
	return kvp_pool_get_cached_block(c->p->pool, k, hl, &g, 1, &id) == KVP_OK ? id : -1;
}

/* No row twice among ids[0..n) (misses, -1, ignored): KVP_OK or INVALID_ARGUMENT. */
static int
distinct_rows(struct call *c, const int32_t *ids, size_t n)
{
	int32_t *s = kvpd_scratch(c, (n + 1) * sizeof(*s));
	size_t k = 0;
	if (s == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++)
		if (ids[i] > 0)
			s[k++] = ids[i];
	qsort(s, k, sizeof(*s), cmp_id);
	for (size_t i = 1; i < k; i++)
		if (s[i] == s[i - 1])
			return kvpd_fail(c, KVP_EINVAL, "a key named twice (row %d)", s[i]);
	return KVP_OK;
}

int
kvpd_h_lookup_and_lock(struct call *c, const Kvpool__V1__LookupAndLockRequest *m,
                       Kvpool__V1__Reply *out)
{
	Kvpool__V1__LookupAndLockReply *r;
	size_t n = 0, looked = 0, hits = 0;
	int32_t *ids, *hit;
	uint32_t *crc, *counts = NULL;
	int rv;

	if ((rv = check_keys(c, m->keys, &n)))
		return rv;
	r = NEW(c, Kvpool__V1__LookupAndLockReply, kvpool__v1__lookup_and_lock_reply__descriptor);
	ids = kvpd_scratch(c, (n + 1) * sizeof(*ids));
	hit = kvpd_scratch(c, (n + 1) * sizeof(*hit));
	crc = kvpd_scratch(c, (n + 1) * sizeof(*crc));
	if (m->uncounted)
		counts = kvpd_scratch(c, (n + 1) * sizeof(*counts));
	if (r == NULL || ids == NULL || hit == NULL || crc == NULL || (m->uncounted && !counts))
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	for (; looked < n; looked++) {
		ids[looked] = cached_row(c, m->keys.data, looked);
		/*
		 * A miss the disk tier holds, or else the cluster tier may: pending
		 * (-2) while the disk's thread (the cluster's agent) fills it. Not
		 * for the agent's own uncounted look at rows it would put.
		 */
		const uint8_t *k = m->keys.data + looked * key_len(c);
		if (ids[looked] < 0 && !m->uncounted && (kvpd_disk_ask(c->p->disk, k, key_len(c), c->now_ms) ||
		                        kvpd_fill_ask(&c->p->fill, k, c->now_ms) == KVPD_FILL_PENDING))
			ids[looked] = -2;
		if (ids[looked] < 0 && m->prefix)
			break;
		if (ids[looked] > 0)
			hit[hits++] = ids[looked];
	}
	if ((rv = distinct_rows(c, ids, looked)) || (rv = room_for_rows(c, hits)) ||
	    (rv = kvpd_room_for_refs(c, hits)))
		return rv;
	if (kvpd_session_reserve(c->sess, hits) != KVP_OK)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	if ((rv = kvp_pool_touch(c->p->pool, hit, hits)) != KVP_OK)
		return kvpd_fail(c, rv, "lock: %s", kvp_strerror(rv));
	for (size_t i = 0; i < hits; i++)
		kvpd_session_add(c->sess, hit[i]);
	c->sess->rows += hits;
	for (size_t i = 0; i < looked; i++)
		crc[i] = ids[i] > 0 ? c->p->row_crc[ids[i]] : 0;
	if (counts != NULL) { /* the cluster agent's look: no hit, each row's count told */
		for (size_t i = 0; i < looked; i++)
			counts[i] = ids[i] > 0 ? c->p->row_hits[ids[i]] : 0;
		r->hits = counts;
		r->n_hits = looked;
	} else {
		for (size_t i = 0; i < hits; i++)
			if (c->p->row_hits[hit[i]] < UINT32_MAX)
				c->p->row_hits[hit[i]]++;
	}
	r->rows = ids;
	r->n_rows = looked;
	r->crc32c = crc;
	r->n_crc32c = looked;
	r->num_hits = (uint32_t)hits;
	out->result_case = KVPOOL__V1__REPLY__RESULT_LOOKUP_AND_LOCK;
	out->lookup_and_lock = r;
	return KVP_OK;
}

int
kvpd_h_unlock(struct call *c, const Kvpool__V1__UnlockRequest *m, Kvpool__V1__Reply *out)
{
	Kvpool__V1__UnlockReply *r;
	size_t n = 0, k;
	int32_t *ids;
	int rv;

	if ((rv = check_keys(c, m->keys, &n)))
		return rv;
	r = NEW(c, Kvpool__V1__UnlockReply, kvpool__v1__unlock_reply__descriptor);
	ids = kvpd_scratch(c, (n + 1) * sizeof(*ids));
	if (r == NULL || ids == NULL)
		return kvpd_fail(c, KVP_ENOMEM, "out of memory");
	/* A locked row is never evicted, so its key still names it. */
	for (size_t i = 0; i < n; i++)
		if ((ids[i] = cached_row(c, m->keys.data, i)) < 0)
			return kvpd_fail(c, KVP_ENOTOWNER, "key %zu is not locked by this session", i);
	if ((rv = distinct_rows(c, ids, n)))
		return rv;
	if ((k = kvpd_session_take(c->sess, ids, n, KVP_NULL_BLOCK)) < n)
		return kvpd_fail(c, KVP_ENOTOWNER, "key %zu is not locked by this session", k);
	if ((rv = kvp_pool_free_blocks(c->p->pool, ids, n)) != KVP_OK) {
		kvpd_session_untake(c->sess, ids, n, KVP_NULL_BLOCK);
		return kvpd_fail(c, rv, "unlock: %s", kvp_strerror(rv));
	}
	rows_released(c, n);
	out->result_case = KVPOOL__V1__REPLY__RESULT_UNLOCK;
	out->unlock = r;
	return KVP_OK;
}
