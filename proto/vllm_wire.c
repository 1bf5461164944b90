/* SPDX-License-Identifier: Apache-2.0 */
#include "proto/vllm_wire.h"

#include <ctype.h>
#include <math.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/block_hash.h"
#include "common/kvp_status.h"

void
kvp_vllm_buf_fini(struct kvp_vllm_buf *b)
{
	free(b->data);
	memset(b, 0, sizeof(*b));
}

/* msgpack-c's writer: appends to our buffer, growing it geometrically. */
static int
buf_write(void *ctx, const char *p, size_t n)
{
	struct kvp_vllm_buf *b = ctx;
	if (n > b->cap - b->len) {
		size_t cap = b->cap ? b->cap : 512;
		while (cap - b->len < n) {
			if (cap > SIZE_MAX / 2)
				return -1;
			cap *= 2;
		}
		uint8_t *d = realloc(b->data, cap);
		if (d == NULL)
			return -1;
		b->data = d;
		b->cap = cap;
	}
	memcpy(b->data + b->len, p, n);
	b->len += n;
	return 0;
}

/* Encoder state: msgpack-c's pack functions return non-zero on a failed write. */
struct enc {
	msgpack_packer pk;
	const struct kvp_vllm_opts *o;
	int err;
};

/*
 * vLLM 0.33's locality of an event: the cluster tier's blocks (medium
 * KVP_MEDIUM_CLUSTER, docs/cluster.md) live in a store across the network, REMOTE as
 * vLLM's network-backed tiers report theirs; every other medium's None.
 */
static const char *
locality_of(const struct kvp_event *ev)
{
	return ev->medium != NULL && strcmp(ev->medium, KVP_MEDIUM_CLUSTER) == 0 ? "REMOTE" : NULL;
}

static void
put_str(struct enc *e, const char *s)
{
	if (s == NULL) {
		e->err |= msgpack_pack_nil(&e->pk);
		return;
	}
	size_t n = strlen(s);
	e->err |= msgpack_pack_str(&e->pk, n);
	e->err |= msgpack_pack_str_body(&e->pk, s, n);
}

static void
put_hash(struct enc *e, const uint8_t *h, size_t len)
{
	if (h == NULL) {
		e->err |= msgpack_pack_nil(&e->pk);
	} else if (e->o->hash_bytes) {
		e->err |= msgpack_pack_bin(&e->pk, len);
		e->err |= msgpack_pack_bin_body(&e->pk, h, len);
	} else {
		e->err |= msgpack_pack_uint64(&e->pk, kvp_hash_event_id(h, len));
	}
}

static void
put_hashes(struct enc *e, const struct kvp_event *ev)
{
	e->err |= msgpack_pack_array(&e->pk, ev->num_hashes);
	for (uint32_t i = 0; i < ev->num_hashes; i++)
		put_hash(e, ev->hashes + (size_t)i * ev->hash_len, ev->hash_len);
}

/* Reads a CBOR head at *p: major type and argument. -1 if truncated or indefinite. */
static int
cbor_head(const uint8_t **p, const uint8_t *end, int *major, uint64_t *arg)
{
	if (*p >= end)
		return -1;
	uint8_t b = *(*p)++, info = b & 31;
	*major = b >> 5;
	if (info < 24) {
		*arg = info;
		return 0;
	}
	if (info > 27)
		return -1;
	size_t n = (size_t)1 << (info - 24);
	if ((size_t)(end - *p) < n)
		return -1;
	*arg = 0;
	for (size_t i = 0; i < n; i++)
		*arg = *arg << 8 | *(*p)++;
	return 0;
}

/*
 * One CBOR item of the subset vLLM's extra keys use (ints, bytes, str,
 * arrays, None, booleans) as msgpack. -1 on anything else, or on nesting
 * past depth 8 (vLLM's keys nest two deep).
 */
static int
cbor_to_msgpack(struct enc *e, const uint8_t **p, const uint8_t *end, int depth)
{
	int major;
	uint64_t arg;

	if (depth > 8 || cbor_head(p, end, &major, &arg) != 0)
		return -1;
	switch (major) {
	case 0:
		e->err |= msgpack_pack_uint64(&e->pk, arg);
		return 0;
	case 1:
		if (arg > (uint64_t)INT64_MAX)
			return -1;
		e->err |= msgpack_pack_int64(&e->pk, -1 - (int64_t)arg);
		return 0;
	case 2:
	case 3:
		if (arg > (uint64_t)(end - *p))
			return -1;
		if (major == 2) {
			e->err |= msgpack_pack_bin(&e->pk, (size_t)arg);
			e->err |= msgpack_pack_bin_body(&e->pk, *p, (size_t)arg);
		} else {
			e->err |= msgpack_pack_str(&e->pk, (size_t)arg);
			e->err |= msgpack_pack_str_body(&e->pk, *p, (size_t)arg);
		}
		*p += arg;
		return 0;
	case 4:
		if (arg > (uint64_t)(end - *p)) /* every item takes a byte at least */
			return -1;
		e->err |= msgpack_pack_array(&e->pk, (size_t)arg);
		for (uint64_t i = 0; i < arg; i++)
			if (cbor_to_msgpack(e, p, end, depth + 1) != 0)
				return -1;
		return 0;
	case 7:
		if (arg == 22) /* 0xf6 None */
			e->err |= msgpack_pack_nil(&e->pk);
		else if (arg == 20)
			e->err |= msgpack_pack_false(&e->pk);
		else if (arg == 21)
			e->err |= msgpack_pack_true(&e->pk);
		else
			return -1;
		return 0;
	default:
		return -1;
	}
}

/* extra_keys: one item per stored block (None or a tuple), or None with no blocks. */
static int
put_extra_keys(struct enc *e, const struct kvp_event *ev)
{
	if (ev->num_hashes == 0 || ev->extra_keys == NULL) {
		e->err |= msgpack_pack_nil(&e->pk);
		return 0;
	}
	e->err |= msgpack_pack_array(&e->pk, ev->num_hashes);
	for (uint32_t i = 0; i < ev->num_hashes; i++) {
		const uint8_t *p = ev->extra_keys + ev->extra_key_offsets[i];
		const uint8_t *end = ev->extra_keys + ev->extra_key_offsets[i + 1];
		if (end < p || cbor_to_msgpack(e, &p, end, 0) != 0 || p != end)
			return -1;
	}
	return 0;
}

static void
put_key(struct enc *e, const char *k)
{
	put_str(e, k);
}

static void
put_opt_u32(struct enc *e, bool has, uint32_t v)
{
	if (has)
		e->err |= msgpack_pack_uint32(&e->pk, v);
	else
		e->err |= msgpack_pack_nil(&e->pk);
}

static int
put_stored(struct enc *e, const struct kvp_event *ev)
{
	bool map = e->o->form == KVP_VLLM_MAP;
	bool has_extra = ev->num_hashes > 0 && ev->extra_keys != NULL;
	bool has_session = ev->session_id != NULL;
	const char *loc = locality_of(ev);

	if (map) {
		/* type + 7 fields without a default, then those that are not None. */
		uint32_t n = 8 + has_extra + ev->has_group_idx + (ev->spec_kind != NULL) +
		             ev->has_sliding_window + (loc != NULL) + has_session;
		e->err |= msgpack_pack_map(&e->pk, n);
		put_key(e, "type");
	} else {
		/* msgspec's array_like with omit_defaults: trailing Nones go, so
		 * locality is written when set or before a session_id, ownership
		 * (None here) only before a session_id (vLLM 0.33: ...,
		 * locality, ownership, session_id). */
		e->err |= msgpack_pack_array(&e->pk, has_session ? 15 : loc != NULL ? 13 : 12);
	}
	put_str(e, "BlockStored");
	if (map)
		put_key(e, "block_hashes");
	put_hashes(e, ev);
	if (map)
		put_key(e, "parent_block_hash");
	put_hash(e, ev->parent, ev->hash_len);
	if (map)
		put_key(e, "token_ids");
	e->err |= msgpack_pack_array(&e->pk, ev->num_tokens);
	for (uint32_t i = 0; i < ev->num_tokens; i++)
		e->err |= msgpack_pack_int64(&e->pk, ev->token_ids[i]);
	if (map)
		put_key(e, "block_size");
	e->err |= msgpack_pack_uint32(&e->pk, ev->block_size);
	if (map)
		put_key(e, "lora_id");
	if (ev->has_lora_id)
		e->err |= msgpack_pack_int64(&e->pk, ev->lora_id);
	else
		e->err |= msgpack_pack_nil(&e->pk);
	if (map)
		put_key(e, "medium");
	put_str(e, ev->medium);
	if (map)
		put_key(e, "lora_name");
	put_str(e, ev->lora_name);
	if (!map || has_extra) {
		if (map)
			put_key(e, "extra_keys");
		if (put_extra_keys(e, ev) != 0)
			return -1;
	}
	if (!map || ev->has_group_idx) {
		if (map)
			put_key(e, "group_idx");
		put_opt_u32(e, ev->has_group_idx, ev->group_idx);
	}
	if (!map || ev->spec_kind != NULL) {
		if (map)
			put_key(e, "kv_cache_spec_kind");
		put_str(e, ev->spec_kind);
	}
	if (!map || ev->has_sliding_window) {
		if (map)
			put_key(e, "kv_cache_spec_sliding_window");
		if (ev->has_sliding_window)
			e->err |= msgpack_pack_int64(&e->pk, ev->sliding_window);
		else
			e->err |= msgpack_pack_nil(&e->pk);
	}
	if (loc != NULL || (has_session && !map)) {
		if (map)
			put_key(e, "locality");
		put_str(e, loc);
	}
	if (has_session) {
		if (!map)
			e->err |= msgpack_pack_nil(&e->pk); /* ownership */
		else
			put_key(e, "session_id");
		put_str(e, ev->session_id);
	}
	return 0;
}

static void
put_removed(struct enc *e, const struct kvp_event *ev)
{
	bool map = e->o->form == KVP_VLLM_MAP;
	const char *loc = locality_of(ev);

	if (map) {
		e->err |= msgpack_pack_map(&e->pk, 3 + ev->has_group_idx + (loc != NULL));
		put_key(e, "type");
	} else {
		e->err |= msgpack_pack_array(&e->pk, loc != NULL ? 5 : 4);
	}
	put_str(e, "BlockRemoved");
	if (map)
		put_key(e, "block_hashes");
	put_hashes(e, ev);
	if (map)
		put_key(e, "medium");
	put_str(e, ev->medium);
	if (!map || ev->has_group_idx) {
		if (map)
			put_key(e, "group_idx");
		put_opt_u32(e, ev->has_group_idx, ev->group_idx);
	}
	if (loc != NULL) {
		if (map)
			put_key(e, "locality");
		put_str(e, loc);
	}
}

int
kvp_vllm_encode(const struct kvp_event_batch *b, double ts, int64_t dp_rank,
                const struct kvp_vllm_opts *o, struct kvp_vllm_buf *out)
{
	struct enc e = {.o = o};
	size_t n;

	if (b == NULL || o == NULL || out == NULL ||
	    (o->form != KVP_VLLM_MAP && o->form != KVP_VLLM_ARRAY))
		return KVP_EINVAL;
	n = kvp_event_batch_count(b);
	out->len = 0;
	msgpack_packer_init(&e.pk, out, buf_write);
	e.err |= msgpack_pack_array(&e.pk, 3);
	e.err |= msgpack_pack_double(&e.pk, ts);
	e.err |= msgpack_pack_array(&e.pk, n);
	for (size_t i = 0; i < n && e.err == 0; i++) {
		struct kvp_event ev;
		(void)kvp_event_batch_get(b, i, &ev);
		if (ev.type == KVP_EVENT_BLOCK_STORED) {
			if (put_stored(&e, &ev) != 0)
				return KVP_EINVAL;
		} else if (ev.type == KVP_EVENT_BLOCK_REMOVED) {
			put_removed(&e, &ev);
		} else if (o->form == KVP_VLLM_MAP) {
			e.err |= msgpack_pack_map(&e.pk, 1);
			put_key(&e, "type");
			put_str(&e, "AllBlocksCleared");
		} else {
			e.err |= msgpack_pack_array(&e.pk, 1);
			put_str(&e, "AllBlocksCleared");
		}
	}
	e.err |= msgpack_pack_int64(&e.pk, dp_rank);
	return e.err == 0 ? KVP_OK : KVP_ENOMEM;
}

void
kvp_vllm_seq_put(uint8_t out[8], uint64_t seq)
{
	for (int i = 7; i >= 0; i--, seq >>= 8)
		out[i] = (uint8_t)seq;
}

uint64_t
kvp_vllm_seq_get(const uint8_t in[8])
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v = v << 8 | in[i];
	return v;
}

bool
kvp_vllm_binds(const char *ep)
{
	return ep != NULL && (strchr(ep, '*') != NULL || strstr(ep, "::") != NULL ||
	                      strncmp(ep, "ipc://", 6) == 0 || strncmp(ep, "inproc://", 9) == 0);
}

int
kvp_vllm_offset_endpoint(const char *ep, uint32_t rank, char *out, size_t cap)
{
	int n;

	if (ep == NULL || out == NULL || cap == 0)
		return KVP_EINVAL;
	if (rank == 0) {
		n = snprintf(out, cap, "%s", ep);
	} else if (strncmp(ep, "tcp://", 6) == 0) {
		const char *colon = strrchr(ep + 6, ':');
		char *end;
		if (colon == NULL || !isdigit((unsigned char)colon[1]))
			return KVP_EINVAL;
		unsigned long port = strtoul(colon + 1, &end, 10);
		if (*end != '\0' || port + rank > 65535)
			return KVP_EINVAL;
		n = snprintf(out, cap, "%.*s:%lu", (int)(colon - ep), ep, port + rank);
	} else if (strncmp(ep, "inproc://", 9) == 0) {
		n = snprintf(out, cap, "%s_dp%u", ep, rank);
	} else {
		return KVP_EINVAL;
	}
	return n >= 0 && (size_t)n < cap ? KVP_OK : KVP_EINVAL;
}

int
kvp_vllm_topic(const char *tmpl, const char *pod, const char *model, const char *pool,
               uint32_t rank, char *out, size_t cap)
{
	size_t k = 0;
	char rank_s[16];

	if (tmpl == NULL || out == NULL || cap == 0)
		return KVP_EINVAL;
	snprintf(rank_s, sizeof(rank_s), "%u", rank);
	for (const char *p = tmpl; *p;) {
		const char *v = NULL;
		size_t skip = 1;
		if (*p == '{') {
			if (strncmp(p, "{pod}", 5) == 0)
				v = pod, skip = 5;
			else if (strncmp(p, "{model}", 7) == 0)
				v = model, skip = 7;
			else if (strncmp(p, "{pool}", 6) == 0)
				v = pool, skip = 6;
			else if (strncmp(p, "{rank}", 6) == 0)
				v = rank_s, skip = 6;
			else
				return KVP_EINVAL;
			if (v == NULL)
				v = "";
		}
		size_t n = v ? strlen(v) : 1;
		if (n >= cap - k)
			return KVP_EINVAL;
		memcpy(out + k, v ? v : p, n);
		k += n;
		p += skip;
	}
	out[k] = '\0';
	return KVP_OK;
}

/* JSON text of one decoded msgpack object; -1 on a failed write. */
static int
json_str(struct kvp_vllm_buf *o, const char *s, size_t n)
{
	int err = buf_write(o, "\"", 1);
	for (size_t i = 0; i < n && err == 0; i++) {
		unsigned char ch = (unsigned char)s[i];
		char esc[8];
		if (ch == '"' || ch == '\\') {
			esc[0] = '\\', esc[1] = (char)ch;
			err = buf_write(o, esc, 2);
		} else if (ch < 0x20) {
			snprintf(esc, sizeof(esc), "\\u%04x", ch);
			err = buf_write(o, esc, 6);
		} else {
			err = buf_write(o, (const char *)&ch, 1);
		}
	}
	return err ? err : buf_write(o, "\"", 1);
}

static int
json_obj(struct kvp_vllm_buf *o, const msgpack_object *v)
{
	char num[40];
	int err = 0;

	switch (v->type) {
	case MSGPACK_OBJECT_NIL:
		return buf_write(o, "null", 4);
	case MSGPACK_OBJECT_BOOLEAN:
		return v->via.boolean ? buf_write(o, "true", 4) : buf_write(o, "false", 5);
	case MSGPACK_OBJECT_POSITIVE_INTEGER:
		snprintf(num, sizeof(num), "%llu", (unsigned long long)v->via.u64);
		return buf_write(o, num, strlen(num));
	case MSGPACK_OBJECT_NEGATIVE_INTEGER:
		snprintf(num, sizeof(num), "%lld", (long long)v->via.i64);
		return buf_write(o, num, strlen(num));
	case MSGPACK_OBJECT_FLOAT32:
	case MSGPACK_OBJECT_FLOAT64:
		if (!isfinite(v->via.f64))
			return buf_write(o, "null", 4);
		snprintf(num, sizeof(num), "%.17g", v->via.f64);
		return buf_write(o, num, strlen(num));
	case MSGPACK_OBJECT_STR:
		return json_str(o, v->via.str.ptr, v->via.str.size);
	case MSGPACK_OBJECT_BIN:
		err = buf_write(o, "\"", 1);
		for (uint32_t i = 0; i < v->via.bin.size && err == 0; i++) {
			snprintf(num, sizeof(num), "%02x", (unsigned char)v->via.bin.ptr[i]);
			err = buf_write(o, num, 2);
		}
		return err ? err : buf_write(o, "\"", 1);
	case MSGPACK_OBJECT_ARRAY:
		err = buf_write(o, "[", 1);
		for (uint32_t i = 0; i < v->via.array.size && err == 0; i++) {
			if (i > 0)
				err = buf_write(o, ",", 1);
			if (err == 0)
				err = json_obj(o, &v->via.array.ptr[i]);
		}
		return err ? err : buf_write(o, "]", 1);
	case MSGPACK_OBJECT_MAP:
		err = buf_write(o, "{", 1);
		for (uint32_t i = 0; i < v->via.map.size && err == 0; i++) {
			const msgpack_object_kv *kv = &v->via.map.ptr[i];
			if (i > 0)
				err = buf_write(o, ",", 1);
			if (err == 0 && kv->key.type == MSGPACK_OBJECT_STR) {
				err = json_str(o, kv->key.via.str.ptr, kv->key.via.str.size);
			} else if (err == 0) {
				struct kvp_vllm_buf k = {0};
				err = json_obj(&k, &kv->key);
				if (err == 0)
					err = json_str(o, (const char *)k.data, k.len);
				kvp_vllm_buf_fini(&k);
			}
			if (err == 0)
				err = buf_write(o, ":", 1);
			if (err == 0)
				err = json_obj(o, &kv->val);
		}
		return err ? err : buf_write(o, "}", 1);
	default:
		return buf_write(o, "null", 4);
	}
}

int
kvp_vllm_payload_json(const uint8_t *payload, size_t len, struct kvp_vllm_buf *out)
{
	msgpack_unpacked u;
	size_t off = 0;
	int rv = KVP_OK;

	if (payload == NULL || out == NULL)
		return KVP_EINVAL;
	out->len = 0;
	msgpack_unpacked_init(&u);
	msgpack_unpack_return r = msgpack_unpack_next(&u, (const char *)payload, len, &off);
	if (r == MSGPACK_UNPACK_NOMEM_ERROR)
		rv = KVP_ENOMEM;
	else if (r != MSGPACK_UNPACK_SUCCESS || off != len)
		rv = KVP_EINVAL;
	else if (json_obj(out, &u.data) != 0 || buf_write(out, "", 1) != 0)
		rv = KVP_ENOMEM;
	else
		out->len--; /* the NUL is not counted */
	msgpack_unpacked_destroy(&u);
	return rv;
}
