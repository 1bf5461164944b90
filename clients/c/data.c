/* libkvpool's data plane: block contents, split into calls below the message limit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_impl.h"
#include "crc32c.h"

/* Room left in every message for the envelope. */
#define OVERHEAD 4096u

#define set_detail kvp_client_fail_
#define call kvp_client_call_

static int
have_exec(struct kvp_client *c)
{
	if (c->info.executor.backend[0] == '\0' || c->info.executor.block_bytes == 0)
		return set_detail(c, KVP_ENOTSUP, "pool %s has no executor", c->info.pool);
	return KVP_OK;
}

/* How many units of `unit` bytes one message carries (0: not even one). */
static size_t
per_call(const struct kvp_client *c, uint64_t unit)
{
	uint64_t lim = c->info.max_msg_bytes ? c->info.max_msg_bytes : (8u << 20);
	uint64_t k = lim > OVERHEAD ? (lim - OVERHEAD) / unit : 0;
	if (c->info.max_ids_per_call && k > c->info.max_ids_per_call)
		k = c->info.max_ids_per_call;
	return (size_t)k;
}

static int
too_large(struct kvp_client *c, uint64_t unit)
{
	char msg[160];
	snprintf(msg, sizeof(msg), "one unit of %llu bytes exceeds the daemon's message limit of %u",
	         (unsigned long long)unit, c->info.max_msg_bytes);
	return set_detail(c, KVP_ETOOLARGE, "%s", msg);
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

/* Reads a varint at *p (< end); false if truncated or longer than 10 bytes. */
static bool
get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
	uint64_t x = 0;
	for (int shift = 0; shift < 70 && *p < end; shift += 7) {
		uint8_t b = *(*p)++;
		x |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80)) {
			*v = x;
			return true;
		}
	}
	return false;
}

/* Skips a field of the given wire type; false if malformed. */
static bool
skip_field(const uint8_t **p, const uint8_t *end, unsigned wt)
{
	uint64_t v;
	switch (wt) {
	case 0:
		return get_varint(p, end, &v);
	case 1:
		return (size_t)(end - *p) >= 8 && (*p += 8, true);
	case 2:
		return get_varint(p, end, &v) && v <= (uint64_t)(end - *p) && (*p += v, true);
	case 5:
		return (size_t)(end - *p) >= 4 && (*p += 4, true);
	default:
		return false;
	}
}

/*
 * Finds a successful ReadBlocks reply's payload and packed checksums in the
 * message itself, so the payload is copied once, into the caller's buffer.
 * false for anything else (an error status, another shape): the caller
 * then decodes the message the ordinary way.
 */
static bool
parse_read_reply(const uint8_t *b, size_t len, uint64_t call_id, const uint8_t **payload,
                 uint64_t *plen, const uint8_t **crc, uint64_t *clen)
{
	const uint8_t *p = b, *end = b + len;
	bool found = false;
	uint64_t tag, v;
	while (p < end) {
		if (!get_varint(&p, end, &tag))
			return false;
		unsigned field = (unsigned)(tag >> 3), wt = (unsigned)(tag & 7);
		if (field == 1 && wt == 0) {
			if (!get_varint(&p, end, &v) || (v != call_id && v != 0))
				return false;
		} else if (field == 2 && wt == 0) {
			if (!get_varint(&p, end, &v) || v != 0)
				return false; /* an error status */
		} else if (field == 28 && wt == 2) {
			const uint8_t *q, *qend;
			if (!get_varint(&p, end, &v) || v > (uint64_t)(end - p))
				return false;
			q = p;
			qend = p + v;
			p = qend;
			*plen = *clen = 0;
			*payload = *crc = q;
			while (q < qend) {
				if (!get_varint(&q, qend, &tag))
					return false;
				if (tag == 0x0a || tag == 0x12) {
					if (!get_varint(&q, qend, &v) || v > (uint64_t)(qend - q))
						return false;
					*(tag == 0x0a ? payload : crc) = q;
					*(tag == 0x0a ? plen : clen) = v;
					q += v;
				} else if (!skip_field(&q, qend, (unsigned)(tag & 7))) {
					return false; /* unpacked checksums and the like: the slow path */
				}
			}
			found = true;
		} else if (!skip_field(&p, end, wt)) {
			return false;
		}
	}
	return found;
}

int
kvp_client_read_blocks(struct kvp_client *c, const int32_t *ids, size_t n, void *buf, size_t len,
                       uint32_t *crcs)
{
	uint64_t bb;
	size_t step;
	int rv;

	if (c == NULL || (n > 0 && (ids == NULL || buf == NULL)))
		return KVP_EINVAL;
	if ((rv = have_exec(c)) != KVP_OK)
		return rv;
	bb = c->info.executor.block_bytes;
	if (n > SIZE_MAX / bb || len != n * bb)
		return set_detail(c, KVP_EINVAL, "buffer of the wrong size for these blocks", NULL);
	if ((step = per_call(c, bb + 16)) == 0)
		return too_large(c, bb + 16);
	for (size_t at = 0; at < n; at += step) {
		size_t k = n - at < step ? n - at : step;
		Kvpool__V1__ReadBlocksRequest m = KVPOOL__V1__READ_BLOCKS_REQUEST__INIT;
		Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
		Kvpool__V1__Reply *r = NULL;
		m.block_ids = (int32_t *)(ids + at);
		m.n_block_ids = k;
		rq.call_case = KVPOOL__V1__REQUEST__CALL_READ_BLOCKS;
		rq.read_blocks = &m;
		nng_msg *msg = NULL;
		const uint8_t *pl, *cr;
		uint64_t plen, clen;
		if ((rv = kvp_client_send_(c, &rq, &msg)) != KVP_OK)
			return part_failed(c, rv, at, at + k, n);
		if (parse_read_reply(nng_msg_body(msg), nng_msg_len(msg), rq.call_id, &pl, &plen, &cr,
		                     &clen)) {
			/* The fast path: checksums verified, payload copied once. */
			if (plen != k * bb || clen != 4 * k) {
				nng_msg_free(msg);
				return set_detail(c, KVP_EINTERNAL, "read: unexpected reply", NULL);
			}
			for (size_t i = 0; i < k; i++) {
				const uint8_t *q = cr + 4 * i;
				uint32_t want = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 |
				                (uint32_t)q[3] << 24;
				uint32_t got = kvp_crc32c(0, pl + i * bb, bb);
				if (got != want) {
					char d[96];
					snprintf(d, sizeof(d), "block %d arrived with a bad checksum", ids[at + i]);
					nng_msg_free(msg);
					return set_detail(c, KVP_EINTERNAL, "%s", d);
				}
				if (crcs)
					crcs[at + i] = got;
			}
			memcpy((unsigned char *)buf + at * bb, pl, k * bb);
			nng_msg_free(msg);
			continue;
		}
		if ((rv = kvp_client_decode_(c, rq.call_id, msg, &r)) != KVP_OK)
			return part_failed(c, rv, at, at + k, n);
		const Kvpool__V1__ReadBlocksReply *rb = r->read_blocks;
		if (r->result_case != KVPOOL__V1__REPLY__RESULT_READ_BLOCKS ||
		    rb->payload.len != k * bb || rb->n_crc32c != k) {
			kvpool__v1__reply__free_unpacked(r, NULL);
			return set_detail(c, KVP_EINTERNAL, "read: unexpected reply", NULL);
		}
		for (size_t i = 0; i < k; i++) {
			uint32_t crc = kvp_crc32c(0, rb->payload.data + i * bb, bb);
			if (crc != rb->crc32c[i]) {
				char d[96];
				snprintf(d, sizeof(d), "block %d arrived with a bad checksum", ids[at + i]);
				kvpool__v1__reply__free_unpacked(r, NULL);
				return set_detail(c, KVP_EINTERNAL, "%s", d);
			}
			if (crcs)
				crcs[at + i] = crc;
		}
		memcpy((unsigned char *)buf + at * bb, rb->payload.data, k * bb);
		kvpool__v1__reply__free_unpacked(r, NULL);
	}
	return KVP_OK;
}

int
kvp_client_write_blocks(struct kvp_client *c, const int32_t *ids, size_t n, const void *buf,
                        size_t len)
{
	uint64_t bb;
	size_t step;
	uint32_t *crcs;
	int rv = KVP_OK;

	if (c == NULL || (n > 0 && (ids == NULL || buf == NULL)))
		return KVP_EINVAL;
	if ((rv = have_exec(c)) != KVP_OK)
		return rv;
	bb = c->info.executor.block_bytes;
	if (n > SIZE_MAX / bb || len != n * bb)
		return set_detail(c, KVP_EINVAL, "buffer of the wrong size for these blocks", NULL);
	if ((step = per_call(c, bb + 16)) == 0)
		return too_large(c, bb + 16);
	if ((crcs = malloc((step < n ? step : n) * sizeof(*crcs) + 1)) == NULL)
		return set_detail(c, KVP_ENOMEM, "out of memory", NULL);
	for (size_t at = 0; at < n; at += step) {
		size_t k = n - at < step ? n - at : step;
		const unsigned char *p = (const unsigned char *)buf + at * bb;
		Kvpool__V1__WriteBlocksRequest m = KVPOOL__V1__WRITE_BLOCKS_REQUEST__INIT;
		Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
		Kvpool__V1__Reply *r = NULL;
		for (size_t i = 0; i < k; i++)
			crcs[i] = kvp_crc32c(0, p + i * bb, bb);
		m.block_ids = (int32_t *)(ids + at);
		m.n_block_ids = k;
		m.payload.data = (uint8_t *)p;
		m.payload.len = k * bb;
		m.crc32c = crcs;
		m.n_crc32c = k;
		rq.call_case = KVPOOL__V1__REQUEST__CALL_WRITE_BLOCKS;
		rq.write_blocks = &m;
		if ((rv = call(c, &rq, &r)) != KVP_OK) {
			rv = part_failed(c, rv, at, at + k, n);
			break;
		}
		kvpool__v1__reply__free_unpacked(r, NULL);
	}
	free(crcs);
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
	step = per_call(c, 16);
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
		if ((rv = call(c, &rq, &r)) != KVP_OK)
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
		return set_detail(c, KVP_EINVAL, "K/V of the wrong size for these tokens", NULL);
	if ((step = per_call(c, 2 * tok * nl + 16)) == 0)
		return too_large(c, 2 * tok * nl + 16);
	if (step < n && nl > 1) {
		/* Parts of [layers][n][...] are gathered layer by layer into [layers][k][...]. */
		if ((kb = malloc(nl * step * tok)) == NULL || (vb = malloc(nl * step * tok)) == NULL) {
			free(kb);
			return set_detail(c, KVP_ENOMEM, "out of memory", NULL);
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
		if ((rv = call(c, &rq, &r)) != KVP_OK) {
			rv = part_failed(c, rv, at, at + cnt, n);
			break;
		}
		kvpool__v1__reply__free_unpacked(r, NULL);
	}
	free(kb);
	free(vb);
	return rv;
}
