/* SPDX-License-Identifier: Apache-2.0 */
/* libkvpool's data plane: block contents, split into calls below the message limit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/c/client_impl.h"
#include "common/crc32c.h"
#include "proto/data_wire.h"

static int
have_exec(struct kvp_client *c)
{
	if (c->info.executor.backend[0] == '\0' || c->info.executor.block_bytes == 0)
		return kvp_client_fail_(c, KVP_ENOTSUP, "pool %s has no executor", c->info.pool);
	return KVP_OK;
}

/* How many units of `unit` bytes one message carries (0: not even one). */
static size_t
per_call(const struct kvp_client *c, uint64_t unit)
{
	uint64_t lim = c->info.max_msg_bytes ? c->info.max_msg_bytes : KVP_WIRE_DEFAULT_MAX_MSG;
	return (size_t)kvp_wire_units_per_call(lim, c->info.max_ids_per_call, unit);
}

static int
too_large(struct kvp_client *c, uint64_t unit)
{
	char msg[160];
	snprintf(msg, sizeof(msg), "one unit of %llu bytes exceeds the daemon's message limit of %u",
	         (unsigned long long)unit, c->info.max_msg_bytes);
	return kvp_client_fail_(c, KVP_ETOOLARGE, "%s", msg);
}

/* Prefixes the detail of a failed part with the range of blocks it covered. */
static int
part_failed(struct kvp_client *c, int rv, size_t from, size_t to, size_t n)
{
	char d[sizeof(c->detail)];
	if (from == 0 && to == n)
		return rv;
	int k = snprintf(d, sizeof(d), "part [%zu, %zu) of %zu: ", from, to, n);
	if (k > 0 && (size_t)k < sizeof(d)) {
		size_t room = sizeof(d) - (size_t)k;
		memcpy(d + k, c->detail, room - 1);
		d[sizeof(d) - 1] = '\0';
		memcpy(c->detail, d, sizeof(d));
	}
	return rv;
}

/*
 * Runs `parts` calls with up to DEPTH in flight on REQ contexts of the
 * client's socket, so the daemon prepares part i+1 while part i crosses the
 * wire and is checked here. build(arg, i, rq) fills part i's call (its
 * memory only needs to last until it is packed); done(arg, i, call_id, msg)
 * takes part i's reply message (and frees it). Parts complete in order. A
 * part that times out (timeout x (retries + 1)) fails the transfer with
 * KVP_EBUSY; reads and writes of distinct blocks are idempotent, so the
 * caller may simply retry.
 */
#define DEPTH 2

typedef void (*build_fn)(void *arg, size_t part, Kvpool__V1__Request *rq);
typedef int (*done_fn)(void *arg, size_t part, uint64_t call_id, nng_msg *msg);

struct slot {
	nng_ctx ctx;
	nng_aio *aio;
	uint64_t call_id;
	bool open, pending;
};

static int
issue(struct kvp_client *c, struct slot *sl, size_t part, build_fn build, void *arg)
{
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	nng_msg *msg;
	int rv;

	build(arg, part, &rq);
	rq.call_id = sl->call_id = c->next_call_id++;
	rq.pool = c->pool;
	rq.session_id = c->session;
	rq.deadline_unix_ms = kvp_client_deadline_(c);
	kvp_client_set_token_(c, &rq);
	size_t len = kvpool__v1__request__get_packed_size(&rq);
	if (nng_msg_alloc(&msg, len) != 0)
		return kvp_client_fail_(c, KVP_ENOMEM, "out of memory", NULL);
	kvpool__v1__request__pack(&rq, nng_msg_body(msg));
	nng_aio_set_msg(sl->aio, msg);
	nng_ctx_send(sl->ctx, sl->aio);
	nng_aio_wait(sl->aio);
	if ((rv = nng_aio_result(sl->aio)) != 0) {
		nng_msg_free(msg);
		return kvp_client_fail_(c, rv == NNG_ETIMEDOUT ? KVP_EBUSY : KVP_EINTERNAL, "send: %s",
		                        nng_strerror(rv));
	}
	nng_ctx_recv(sl->ctx, sl->aio);
	sl->pending = true;
	return KVP_OK;
}

static int
run_parts(struct kvp_client *c, size_t parts, build_fn build, done_fn done, void *arg)
{
	struct slot sl[DEPTH];
	size_t next = 0, depth = parts < DEPTH ? parts : DEPTH;
	nng_duration limit = (nng_duration)(c->timeout_ms * (c->retries + 1));
	int rv = KVP_OK;

	memset(sl, 0, sizeof(sl));
	for (size_t i = 0; i < depth && rv == KVP_OK; i++) {
		if (nng_aio_alloc(&sl[i].aio, NULL, NULL) != 0 || nng_ctx_open(&sl[i].ctx, c->sock) != 0) {
			rv = kvp_client_fail_(c, KVP_ENOMEM, "cannot open a request context", NULL);
			break;
		}
		sl[i].open = true;
		nng_aio_set_timeout(sl[i].aio, limit);
	}
	for (size_t i = 0; i < depth && rv == KVP_OK; i++)
		rv = issue(c, &sl[i], next++, build, arg);
	for (size_t part = 0; part < parts && rv == KVP_OK; part++) {
		struct slot *s = &sl[part % depth];
		nng_aio_wait(s->aio);
		s->pending = false;
		if ((rv = nng_aio_result(s->aio)) != 0) {
			rv = kvp_client_fail_(c, rv == NNG_ETIMEDOUT ? KVP_EBUSY : KVP_EINTERNAL,
			                      "no reply from the daemon (%s)", nng_strerror(rv));
			break;
		}
		if ((rv = done(arg, part, s->call_id, nng_aio_get_msg(s->aio))) != KVP_OK)
			break;
		if (next < parts)
			rv = issue(c, s, next++, build, arg);
	}
	for (size_t i = 0; i < depth; i++) {
		if (sl[i].pending) {
			/* A failure elsewhere: drop this part's reply, whatever it was. */
			nng_aio_cancel(sl[i].aio);
			nng_aio_wait(sl[i].aio);
			if (nng_aio_result(sl[i].aio) == 0)
				nng_msg_free(nng_aio_get_msg(sl[i].aio));
		}
		if (sl[i].open)
			nng_ctx_close(sl[i].ctx);
		nng_aio_free(sl[i].aio);
	}
	return rv;
}

/*
 * Checks a block transfer's arguments against the pool's layout and works
 * out its parts: *bb bytes a block, *step blocks a call.
 */
static int
plan(struct kvp_client *c, const int32_t *ids, size_t n, const void *buf, size_t len,
     uint64_t *bb, size_t *step)
{
	int rv;
	if (c == NULL || (n > 0 && (ids == NULL || buf == NULL)))
		return KVP_EINVAL;
	if ((rv = have_exec(c)) != KVP_OK)
		return rv;
	*bb = c->info.executor.block_bytes;
	if (n > SIZE_MAX / *bb || len != n * *bb)
		return kvp_client_fail_(c, KVP_EINVAL, "buffer of the wrong size for these blocks", NULL);
	if ((*step = per_call(c, *bb + KVP_WIRE_BLOCK_EXTRA)) == 0)
		return too_large(c, *bb + 16);
	return KVP_OK;
}

/* A read in parts. */
struct read_job {
	struct kvp_client *c;
	const int32_t *ids;
	size_t n, step;
	uint64_t bb;
	unsigned char *buf;
	uint32_t *crcs;
	Kvpool__V1__ReadBlocksRequest m;
};

static void
read_build(void *arg, size_t part, Kvpool__V1__Request *rq)
{
	struct read_job *j = arg;
	size_t at = part * j->step;
	Kvpool__V1__ReadBlocksRequest init = KVPOOL__V1__READ_BLOCKS_REQUEST__INIT;
	j->m = init;
	j->m.block_ids = (int32_t *)(j->ids + at);
	j->m.n_block_ids = j->n - at < j->step ? j->n - at : j->step;
	rq->call_case = KVPOOL__V1__REQUEST__CALL_READ_BLOCKS;
	rq->read_blocks = &j->m;
}

/* Checks k blocks' checksums (little-endian fixed32s at crc) and copies them out. */
static int
take_blocks(struct read_job *j, size_t at, size_t k, const uint8_t *pl, const uint8_t *crc,
            const uint32_t *crc_words)
{
	for (size_t i = 0; i < k; i++) {
		uint32_t want = crc_words ? crc_words[i] : kvp_wire_get_crc(crc, i);
		unsigned char *dst = j->buf + (at + i) * j->bb;
		/* Copy first, then check the copy while it is still in cache. */
		memcpy(dst, pl + i * j->bb, j->bb);
		uint32_t got = kvp_crc32c(0, dst, j->bb);
		if (got != want) {
			char d[96];
			snprintf(d, sizeof(d), "block %d arrived with a bad checksum", j->ids[at + i]);
			return kvp_client_fail_(j->c, KVP_EINTERNAL, "%s", d);
		}
		if (j->crcs)
			j->crcs[at + i] = got;
	}
	return KVP_OK;
}

static int
read_done(void *arg, size_t part, uint64_t call_id, nng_msg *msg)
{
	struct read_job *j = arg;
	struct kvp_client *c = j->c;
	size_t at = part * j->step, k = j->n - at < j->step ? j->n - at : j->step;
	const uint8_t *pl, *cr;
	uint64_t plen, clen;
	Kvpool__V1__Reply *r = NULL;
	int rv;

	if (kvp_wire_read_reply_parse(nng_msg_body(msg), nng_msg_len(msg), call_id, &pl, &plen, &cr,
	                              &clen)) {
		/* The fast path: the payload is copied once, out of the message. */
		rv = plen == k * j->bb && clen == 4 * k
		             ? take_blocks(j, at, k, pl, cr, NULL)
		             : kvp_client_fail_(c, KVP_EINTERNAL, "read: unexpected reply", NULL);
		nng_msg_free(msg);
		return part_failed(c, rv, at, at + k, j->n);
	}
	if ((rv = kvp_client_decode_(c, call_id, msg, &r)) != KVP_OK)
		return part_failed(c, rv, at, at + k, j->n);
	const Kvpool__V1__ReadBlocksReply *rb = r->read_blocks;
	if (r->result_case != KVPOOL__V1__REPLY__RESULT_READ_BLOCKS || rb->payload.len != k * j->bb ||
	    rb->n_crc32c != k)
		rv = kvp_client_fail_(c, KVP_EINTERNAL, "read: unexpected reply", NULL);
	else
		rv = take_blocks(j, at, k, rb->payload.data, NULL, rb->crc32c);
	kvpool__v1__reply__free_unpacked(r, NULL);
	return part_failed(c, rv, at, at + k, j->n);
}

int
kvp_client_read_blocks(struct kvp_client *c, const int32_t *ids, size_t n, void *buf, size_t len,
                       uint32_t *crcs)
{
	struct read_job j = {.c = c, .ids = ids, .n = n, .buf = buf, .crcs = crcs};
	int rv = plan(c, ids, n, buf, len, &j.bb, &j.step);

	if (rv != KVP_OK || n == 0)
		return rv;
	return run_parts(c, (n + j.step - 1) / j.step, read_build, read_done, &j);
}

/* A write in parts. */
struct write_job {
	struct kvp_client *c;
	const int32_t *ids;
	size_t n, step;
	uint64_t bb;
	const unsigned char *buf;
	uint32_t *crcs; /* every block's, computed once */
	Kvpool__V1__WriteBlocksRequest m;
};

static void
write_build(void *arg, size_t part, Kvpool__V1__Request *rq)
{
	struct write_job *j = arg;
	size_t at = part * j->step, k = j->n - at < j->step ? j->n - at : j->step;
	Kvpool__V1__WriteBlocksRequest init = KVPOOL__V1__WRITE_BLOCKS_REQUEST__INIT;
	j->m = init;
	j->m.block_ids = (int32_t *)(j->ids + at);
	j->m.n_block_ids = k;
	j->m.payload.data = (uint8_t *)(j->buf + at * j->bb);
	j->m.payload.len = k * j->bb;
	j->m.crc32c = j->crcs + at;
	j->m.n_crc32c = k;
	rq->call_case = KVPOOL__V1__REQUEST__CALL_WRITE_BLOCKS;
	rq->write_blocks = &j->m;
}

static int
write_done(void *arg, size_t part, uint64_t call_id, nng_msg *msg)
{
	struct write_job *j = arg;
	size_t at = part * j->step, k = j->n - at < j->step ? j->n - at : j->step;
	Kvpool__V1__Reply *r = NULL;
	int rv = kvp_client_decode_(j->c, call_id, msg, &r);
	if (rv == KVP_OK)
		kvpool__v1__reply__free_unpacked(r, NULL);
	return part_failed(j->c, rv, at, at + k, j->n);
}

int
kvp_client_write_blocks(struct kvp_client *c, const int32_t *ids, size_t n, const void *buf,
                        size_t len)
{
	struct write_job j = {.c = c, .ids = ids, .n = n, .buf = buf};
	int rv = plan(c, ids, n, buf, len, &j.bb, &j.step);

	if (rv != KVP_OK || n == 0)
		return rv;
	if ((j.crcs = malloc(n * sizeof(*j.crcs))) == NULL)
		return kvp_client_fail_(c, KVP_ENOMEM, "out of memory", NULL);
	for (size_t i = 0; i < n; i++)
		j.crcs[i] = kvp_crc32c(0, j.buf + i * j.bb, j.bb);
	rv = run_parts(c, (n + j.step - 1) / j.step, write_build, write_done, &j);
	free(j.crcs);
	return rv;
}

int
kvp_client_copy_blocks(struct kvp_client *c, const int32_t *src, const int32_t *dst, size_t n)
{
	size_t step;
	int rv;

	if (c == NULL || (n > 0 && (src == NULL || dst == NULL)))
		return KVP_EINVAL;
	if ((rv = have_exec(c)) != KVP_OK)
		return rv;
	step = per_call(c, KVP_WIRE_BLOCK_EXTRA); /* a pair of ids */
	for (size_t at = 0; at < n; at += step) {
		size_t k = n - at < step ? n - at : step;
		Kvpool__V1__CopyBlocksRequest m = KVPOOL__V1__COPY_BLOCKS_REQUEST__INIT;
		Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
		Kvpool__V1__Reply *r = NULL;
		m.src_block_ids = (int32_t *)(src + at);
		m.n_src_block_ids = k;
		m.dst_block_ids = (int32_t *)(dst + at);
		m.n_dst_block_ids = k;
		rq.call_case = KVPOOL__V1__REQUEST__CALL_COPY_BLOCKS;
		rq.copy_blocks = &m;
		if ((rv = kvp_client_call_(c, &rq, &r)) != KVP_OK)
			return part_failed(c, rv, at, at + k, n);
		kvpool__v1__reply__free_unpacked(r, NULL);
	}
	return KVP_OK;
}

static uint32_t
dtype_bytes(const char *dtype)
{
	return strcmp(dtype, "fp32") == 0 ? 4 : 2;
}

int
kvp_client_write_tokens(struct kvp_client *c, bool all_layers, uint32_t layer,
                        const int64_t *slots, size_t n, const void *k, const void *v,
                        size_t kv_len)
{
	const struct kvp_client_executor *x;
	uint64_t tok, nl;
	size_t step;
	unsigned char *kb = NULL, *vb = NULL;
	int rv = KVP_OK;

	if (c == NULL || (n > 0 && (slots == NULL || k == NULL || v == NULL)))
		return KVP_EINVAL;
	if ((rv = have_exec(c)) != KVP_OK)
		return rv;
	x = &c->info.executor;
	tok = (uint64_t)x->num_heads * x->head_size * dtype_bytes(x->dtype);
	nl = all_layers ? x->num_layers : 1;
	if (n > SIZE_MAX / (tok * nl) || kv_len != n * tok * nl)
		return kvp_client_fail_(c, KVP_EINVAL, "K/V of the wrong size for these tokens", NULL);
	if ((step = per_call(c, 2 * tok * nl + KVP_WIRE_BLOCK_EXTRA)) == 0)
		return too_large(c, 2 * tok * nl + 16);
	if (step < n && nl > 1) {
		/* Parts of [layers][n][...] are gathered layer by layer into [layers][k][...]. */
		if ((kb = malloc(nl * step * tok)) == NULL || (vb = malloc(nl * step * tok)) == NULL) {
			free(kb);
			return kvp_client_fail_(c, KVP_ENOMEM, "out of memory", NULL);
		}
	}
	for (size_t at = 0; at < n; at += step) {
		size_t cnt = n - at < step ? n - at : step;
		Kvpool__V1__WriteTokensRequest m = KVPOOL__V1__WRITE_TOKENS_REQUEST__INIT;
		Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
		Kvpool__V1__Reply *r = NULL;
		if (kb != NULL) {
			for (uint64_t l = 0; l < nl; l++) {
				memcpy(kb + l * cnt * tok, (const unsigned char *)k + (l * n + at) * tok, cnt * tok);
				memcpy(vb + l * cnt * tok, (const unsigned char *)v + (l * n + at) * tok, cnt * tok);
			}
			m.key.data = kb;
			m.value.data = vb;
		} else {
			m.key.data = (uint8_t *)k + at * tok;
			m.value.data = (uint8_t *)v + at * tok;
		}
		m.key.len = m.value.len = nl * cnt * tok;
		m.all_layers = all_layers;
		m.layer = layer;
		m.slot_mapping = (int64_t *)(slots + at);
		m.n_slot_mapping = cnt;
		rq.call_case = KVPOOL__V1__REQUEST__CALL_WRITE_TOKENS;
		rq.write_tokens = &m;
		if ((rv = kvp_client_call_(c, &rq, &r)) != KVP_OK) {
			rv = part_failed(c, rv, at, at + cnt, n);
			break;
		}
		kvpool__v1__reply__free_unpacked(r, NULL);
	}
	free(kb);
	free(vb);
	return rv;
}
