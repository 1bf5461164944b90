/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A Commit's checksums, taken before and outside the pool's lock
 * (dispatch.h: struct kvpd_precomputed): the server prepares them under
 * the lock, checksums without it, and the Commit handler uses them if its
 * keys still name the same rows. Reads the pool and the session table;
 * calls no handler.
 */
#include "service/rpc/dispatch.h"

#include <stdlib.h>
#include <string.h>

#include "common/crc32c.h"
#include "common/map_key.h"
#include "engine/pool.h"
#include "gpu/executor.h"
#include "service/rpc/call.h"

void
kvpd_commit_prepare(struct kvpd_pool *p, const Kvpool__V1__Request *rq,
                    struct kvpd_precomputed *pre)
{
	const Kvpool__V1__CommitRequest *m = rq->commit;
	size_t kl, n;
	struct kvpd_session *sess;
	size_t index;

	memset(pre, 0, sizeof(*pre));
	if (m == NULL || m->n_crc32c != 0 || m->no_checksum || p->row_crc == NULL || p->exec == NULL)
		return;
	kl = kvp_pool_hash_len(p->pool) + KVP_MAP_KEY_GROUP_LEN;
	n = m->keys.len / kl;
	if (n == 0 || m->keys.len % kl != 0 || n > p->limits.max_ids ||
	    (sess = kvpd_pool_find_session(p, rq->session_id, &index)) == NULL)
		return; /* the handler refuses it */
	if ((pre->ids = malloc(n * sizeof(*pre->ids))) == NULL ||
	    (pre->crcs = malloc(n * sizeof(*pre->crcs))) == NULL) {
		kvpd_precomputed_fini(pre);
		return; /* the handler checksums under the lock */
	}
	for (size_t i = 0; i < n; i++) {
		int32_t id = kvp_pool_pending_block(p->pool, m->keys.data + i * kl, kl);
		if (id < 0 || kvpd_session_held(sess, id) == 0) {
			kvpd_precomputed_fini(pre);
			return;
		}
		pre->ids[i] = id;
	}
	pre->n = n;
}

void
kvpd_commit_checksum(struct kvpd_pool *p, struct kvpd_precomputed *pre)
{
	struct kvp_exec_region r;

	if (pre->n == 0 || kvp_exec_region(p->exec, &r) != KVP_OK) {
		pre->n = 0;
		return;
	}
	/*
	 * The rows are this session's reservations: no other session can take
	 * or write them. Should the session end meanwhile and a row go to
	 * another store, the handler finds its key no longer this session's
	 * and these checksums are not used.
	 */
	size_t bytes = kvp_exec_block_bytes(p->exec);
	for (size_t i = 0; i < pre->n; i++)
		pre->crcs[i] = kvp_crc32c(0, r.base + (uint64_t)pre->ids[i] * r.row_stride, bytes);
}

void
kvpd_precomputed_fini(struct kvpd_precomputed *pre)
{
	free(pre->ids);
	free(pre->crcs);
	memset(pre, 0, sizeof(*pre));
}
