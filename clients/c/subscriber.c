/* SPDX-License-Identifier: Apache-2.0 */
#include "clients/c/subscriber.h"

#include <nng/nng.h>
#include <nng/protocol/pubsub0/sub.h>
#include <nng/supplemental/tls/tls.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/wire.h"

/* One followed pool: where its stream stands. */
struct pool_state {
	char name[KVP_WIRE_MAX_NAME];
	char topic[KVP_WIRE_MAX_NAME + 1];  /* the name and its 0 byte */
	size_t topic_len;
	struct kvp_client *rpc;             /* its session, for Replay and Snapshot */
	struct kvp_sub_stats st;
	uint64_t newest_seen;               /* the highest seq seen on the stream, plus one */
};

struct kvp_sub {
	struct kvp_sub_options o;
	struct kvp_sub_handler h;
	struct pool_state *pools;
	size_t num_pools;
	struct pool_state *cur;             /* the pool a replay is for */
	nng_socket sock;
	nng_tls_config *tls;
	struct kvp_event_batch events;
	char detail[256];
	int replay_failed;                  /* a replayed batch did not fit: resynchronise */
};

static struct kvp_client_options
rpc_options(const struct kvp_sub *s, const struct pool_state *ps)
{
	struct kvp_client_options co = {
		.url = s->o.rpc_url, .pool = ps->name, .token = s->o.token,
		.client_name = "kvp-subscriber", .timeout_ms = s->o.timeout_ms,
		.lease_ms = 86400000u, /* it holds no blocks: a long lease costs nothing */
		.tls_ca_file = s->o.tls_ca_file, .tls_cert_file = s->o.tls_cert_file,
		.tls_key_file = s->o.tls_key_file, .tls_server_name = s->o.tls_server_name,
	};
	return co;
}

/* Reopens a pool's RPC session if the daemon no longer knows it (restart). */
static int
rpc_again(struct kvp_sub *s, struct pool_state *ps, int rv)
{
	if (rv != KVP_EUNAUTH)
		return rv;
	struct kvp_client_options co = rpc_options(s, ps);
	struct kvp_client *c = NULL;
	if ((rv = kvp_client_open(&co, &c)) != KVP_OK)
		return rv;
	kvp_client_detach(ps->rpc);
	ps->rpc = c;
	return KVP_EBUSY; /* try the call again */
}

/* Static names for the spec kinds vLLM defines; the engine's events point at them. */
static const char *
kind_name(const char *k)
{
	static const char *const kinds[] = {
		"full_attention", "sliding_window", "mla_attention", "mamba", "sliding_window_mla",
		"chunked_local_attention", "sink_full_attention", "encoder_only_attention",
		"cross_attention",
	};
	if (k == NULL || k[0] == '\0')
		return NULL;
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
		if (strcmp(k, kinds[i]) == 0)
			return kinds[i];
	return "unknown";
}

static int
decode_event(const Kvpool__V1__Event *e, struct kvp_event_batch *out)
{
	if (e->event_case == KVPOOL__V1__EVENT__EVENT_CLEARED) {
		if (kvp_event_batch_reserve(out, 1, 0) != KVP_OK)
			return KVP_ENOMEM;
		kvp_event_append_cleared(out);
		return KVP_OK;
	}
	if (e->event_case == KVPOOL__V1__EVENT__EVENT_REMOVED) {
		const Kvpool__V1__EventRemoved *m = e->removed;
		size_t hl = m->hash_len;
		if (hl == 0 || m->block_hashes.len % hl != 0)
			return KVP_EINVAL;
		size_t n = m->block_hashes.len / hl;
		const char *medium = m->medium && m->medium[0] ? m->medium : NULL;
		if (kvp_event_batch_reserve(out, n, n * kvp_event_removed_bytes(hl, medium)) != KVP_OK)
			return KVP_ENOMEM;
		for (size_t i = 0; i < n; i++)
			kvp_event_append_removed(out, m->block_hashes.data + i * hl, hl, medium, m->group_idx);
		return KVP_OK;
	}
	if (e->event_case != KVPOOL__V1__EVENT__EVENT_STORED)
		return KVP_EINVAL;
	const Kvpool__V1__EventStored *m = e->stored;
	size_t hl = m->hash_len, n, extra = 0;
	if (hl == 0 || m->block_hashes.len % hl != 0 ||
	    (m->has_parent && m->parent_hash.len != hl))
		return KVP_EINVAL;
	n = m->block_hashes.len / hl;
	if (m->n_extra_keys != n && m->n_extra_keys != 0)
		return KVP_EINVAL;
	for (size_t i = 0; i < m->n_extra_keys; i++)
		extra += m->extra_keys[i].len ? m->extra_keys[i].len : 1;
	if (m->n_extra_keys == 0)
		extra = n;
	const char *medium = m->medium && m->medium[0] ? m->medium : NULL;
	const char *lora = m->lora_name && m->lora_name[0] ? m->lora_name : NULL;
	if (kvp_event_batch_reserve(out, 1,
	                            kvp_event_stored_bytes(n, hl, m->has_parent, m->n_token_ids, lora,
	                                                   medium, extra)) != KVP_OK)
		return KVP_ENOMEM;
	struct kvp_stored_desc d = {
		.hash_len = hl, .parent = m->has_parent ? m->parent_hash.data : NULL,
		.token_ids = m->token_ids, .num_tokens = m->n_token_ids, .block_size = m->block_size,
		.has_lora_id = m->has_lora_id, .lora_id = m->lora_id, .lora_name = lora,
		.medium = medium, .group_idx = m->group_idx, .max_hashes = n,
	};
	kvp_event_stored_begin(out, &d);
	for (size_t i = 0; i < n; i++) {
		static const uint8_t none = 0xf6;
		const uint8_t *x = &none;
		size_t xl = 1;
		if (m->n_extra_keys && m->extra_keys[i].len) {
			x = m->extra_keys[i].data;
			xl = m->extra_keys[i].len;
		}
		kvp_event_stored_add(out, m->block_hashes.data + i * hl, x, xl);
	}
	kvp_event_stored_end(out);
	(void)kvp_event_batch_set_spec(out, kvp_event_batch_count(out) - 1, kind_name(m->spec_kind),
	                               m->has_sliding_window, m->sliding_window);
	return KVP_OK;
}

static int
decode_batch(const uint8_t *bytes, size_t len, uint64_t *epoch, uint64_t *seq, uint64_t *ts,
             bool *tick, struct kvp_event_batch *out)
{
	Kvpool__V1__EventBatch *b;
	int rv = KVP_OK;

	if ((b = kvpool__v1__event_batch__unpack(NULL, len, bytes)) == NULL)
		return KVP_EINVAL;
	kvp_event_batch_clear(out);
	for (size_t i = 0; i < b->n_events && rv == KVP_OK; i++)
		rv = decode_event(b->events[i], out);
	*epoch = b->epoch;
	*seq = b->seq;
	*ts = b->ts_unix_ns;
	*tick = b->tick;
	kvpool__v1__event_batch__free_unpacked(b, NULL);
	return rv;
}

int
kvp_event_batch_decode(const uint8_t *bytes, size_t len, uint64_t *epoch, uint64_t *seq,
                       uint64_t *ts_unix_ns, struct kvp_event_batch *out)
{
	uint64_t ts;
	bool tick;

	if (bytes == NULL || out == NULL || epoch == NULL || seq == NULL)
		return KVP_EINVAL;
	int rv = decode_batch(bytes, len, epoch, seq, &ts, &tick, out);
	if (rv == KVP_OK && ts_unix_ns)
		*ts_unix_ns = ts;
	return rv;
}

/* ---- the subscriber ---- */

static int
resync(struct kvp_sub *s, struct pool_state *ps)
{
	struct kvp_snapshot *snap = NULL;
	int rv = kvp_client_snapshot(ps->rpc, &snap);
	if (rv != KVP_OK && rpc_again(s, ps, rv) == KVP_EBUSY)
		rv = kvp_client_snapshot(ps->rpc, &snap);
	if (rv != KVP_OK) {
		snprintf(s->detail, sizeof(s->detail), "%s: snapshot: %s", ps->name,
		         kvp_client_last_detail(ps->rpc));
		return rv;
	}
	ps->st.epoch = snap->epoch;
	ps->st.next_seq = snap->next_seq;
	ps->st.resets++;
	if (s->h.reset)
		s->h.reset(s->h.ctx, ps->name, snap->epoch, snap->next_seq, snap->entries,
		           snap->num_entries);
	kvp_snapshot_free(snap);
	return KVP_OK;
}

static void
deliver(struct kvp_sub *s, struct pool_state *ps, uint64_t seq, uint64_t ts)
{
	if (s->h.batch)
		s->h.batch(s->h.ctx, ps->name, ps->st.epoch, seq, ts, &s->events);
	ps->st.next_seq = seq + 1;
	ps->st.batches++;
}

static void
replayed(void *ctx, const uint8_t *bytes, size_t len)
{
	struct kvp_sub *s = ctx;
	struct pool_state *ps = s->cur;
	uint64_t epoch, seq, ts;
	bool tick;

	if (s->replay_failed)
		return;
	if (decode_batch(bytes, len, &epoch, &seq, &ts, &tick, &s->events) != KVP_OK || tick ||
	    epoch != ps->st.epoch || seq != ps->st.next_seq) {
		s->replay_failed = 1; /* out of order or corrupt: fall back to a snapshot */
		return;
	}
	deliver(s, ps, seq, ts);
	ps->st.replayed++;
}

/* Fills [next_seq, upto) by Replay, or resynchronises from a Snapshot. */
static int
repair(struct kvp_sub *s, struct pool_state *ps, uint64_t upto)
{
	bool available = false;
	uint64_t next = 0;
	int rv;

	ps->st.gaps++;
	s->replay_failed = 0;
	s->cur = ps;
	rv = kvp_client_replay(ps->rpc, ps->st.epoch, ps->st.next_seq, &available, &next, replayed, s);
	if (rv != KVP_OK && rpc_again(s, ps, rv) == KVP_EBUSY)
		rv = kvp_client_replay(ps->rpc, ps->st.epoch, ps->st.next_seq, &available, &next,
		                       replayed, s);
	if (rv != KVP_OK) {
		snprintf(s->detail, sizeof(s->detail), "%s: replay: %s", ps->name,
		         kvp_client_last_detail(ps->rpc));
		return rv;
	}
	if (!available || s->replay_failed || ps->st.next_seq < upto)
		return resync(s, ps);
	return KVP_OK;
}

static struct pool_state *
pool_of(struct kvp_sub *s, const uint8_t *body, size_t len)
{
	for (size_t i = 0; i < s->num_pools; i++) {
		struct pool_state *ps = &s->pools[i];
		if (len >= ps->topic_len && memcmp(body, ps->topic, ps->topic_len) == 0)
			return ps;
	}
	return NULL;
}

static int
handle(struct kvp_sub *s, const uint8_t *body, size_t len)
{
	struct pool_state *ps = pool_of(s, body, len);
	const uint8_t *bytes;
	uint64_t epoch, seq, ts;
	bool tick;
	int rv;

	if (ps == NULL)
		return KVP_OK; /* a pool we do not follow */
	bytes = body + ps->topic_len;
	len -= ps->topic_len;
	if ((rv = decode_batch(bytes, len, &epoch, &seq, &ts, &tick, &s->events)) != KVP_OK) {
		snprintf(s->detail, sizeof(s->detail), "%s: a published batch did not decode",
		         ps->name);
		return rv;
	}
	/* A tick carries no events; its seq is the next batch's. */
	uint64_t newest = tick ? seq : seq + 1;
	if (newest > ps->newest_seen)
		ps->newest_seen = newest;
	if (epoch != ps->st.epoch) {
		/* The daemon restarted (or we started before it): start over. */
		if ((rv = resync(s, ps)) != KVP_OK || tick || epoch != ps->st.epoch)
			return rv; /* a tick, or an old epoch's straggler */
		if ((rv = decode_batch(bytes, len, &epoch, &seq, &ts, &tick, &s->events)) != KVP_OK)
			return rv;
	}
	if (tick)
		return seq > ps->st.next_seq ? repair(s, ps, seq) : KVP_OK;
	if (seq < ps->st.next_seq)
		return KVP_OK; /* already applied (replayed, or in the snapshot) */
	if (seq > ps->st.next_seq) {
		if ((rv = repair(s, ps, seq)) != KVP_OK)
			return rv;
		if (seq < ps->st.next_seq || epoch != ps->st.epoch)
			return KVP_OK;
		if (seq > ps->st.next_seq)
			return resync(s, ps);
		/* The repair used s->events: decode this batch again. */
		if ((rv = decode_batch(bytes, len, &epoch, &seq, &ts, &tick, &s->events)) != KVP_OK)
			return rv;
	}
	deliver(s, ps, seq, ts);
	return KVP_OK;
}

int
kvp_sub_poll(struct kvp_sub *s, uint32_t timeout_ms)
{
	int rv = KVP_OK, flags = 0;

	if (s == NULL)
		return KVP_EINVAL;
	(void)nng_socket_set_ms(s->sock, NNG_OPT_RECVTIMEO, (nng_duration)timeout_ms);
	for (;;) {
		nng_msg *msg;
		int e = nng_recvmsg(s->sock, &msg, flags);
		if (e == NNG_ETIMEDOUT || e == NNG_EAGAIN)
			break;
		if (e != 0) {
			snprintf(s->detail, sizeof(s->detail), "receive: %s", nng_strerror(e));
			return KVP_EINTERNAL;
		}
		rv = handle(s, nng_msg_body(msg), nng_msg_len(msg));
		nng_msg_free(msg);
		if (rv != KVP_OK)
			return rv;
		flags = NNG_FLAG_NONBLOCK; /* then drain what is queued */
	}
	return rv;
}

int
kvp_sub_open(const struct kvp_sub_options *o, const struct kvp_sub_handler *h,
             struct kvp_sub **out)
{
	static const char *const default_pool[] = {"default"};
	const char *const *names;
	size_t n;
	struct kvp_sub *s;
	int rv;

	if (o == NULL || h == NULL || out == NULL || o->events_url == NULL || o->rpc_url == NULL ||
	    (o->pools && o->num_pools == 0))
		return KVP_EINVAL;
	names = o->pools ? o->pools : (o->pool ? &o->pool : default_pool);
	n = o->pools ? o->num_pools : 1;
	for (size_t i = 0; i < n; i++)
		if (names[i] == NULL || strlen(names[i]) >= KVP_WIRE_MAX_NAME)
			return KVP_EINVAL;
	if ((s = calloc(1, sizeof(*s))) == NULL || (s->pools = calloc(n, sizeof(*s->pools))) == NULL) {
		free(s);
		return KVP_ENOMEM;
	}
	s->o = *o;
	s->h = *h;
	s->num_pools = n;
	kvp_event_batch_init(&s->events);
	if (nng_sub0_open(&s->sock) != 0) {
		kvp_sub_close(s);
		return KVP_EINTERNAL;
	}
	(void)nng_socket_set_int(s->sock, NNG_OPT_RECVBUF, o->recv_buffer ? o->recv_buffer : 8192);
	(void)nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, 64u << 20);
	(void)nng_socket_set_ms(s->sock, NNG_OPT_RECONNMINT, 10);
	(void)nng_socket_set_ms(s->sock, NNG_OPT_RECONNMAXT, 1000);
	for (size_t i = 0; i < n; i++) {
		struct pool_state *ps = &s->pools[i];
		snprintf(ps->name, sizeof(ps->name), "%s", names[i]);
		ps->topic_len = strlen(ps->name) + 1;
		memcpy(ps->topic, ps->name, ps->topic_len);
		if (nng_socket_set(s->sock, NNG_OPT_SUB_SUBSCRIBE, ps->topic, ps->topic_len) != 0) {
			kvp_sub_close(s);
			return KVP_EINTERNAL;
		}
	}
	nng_dialer d;
	if ((rv = nng_dialer_create(&d, s->sock, o->events_url)) != 0) {
		kvp_sub_close(s);
		return KVP_EINVAL;
	}
	if (strncmp(o->events_url, "tls+", 4) == 0) {
		if (nng_tls_config_alloc(&s->tls, NNG_TLS_MODE_CLIENT) != 0 ||
		    (o->tls_ca_file && nng_tls_config_ca_file(s->tls, o->tls_ca_file) != 0) ||
		    (o->tls_server_name && nng_tls_config_server_name(s->tls, o->tls_server_name) != 0)) {
			kvp_sub_close(s);
			return KVP_EINTERNAL;
		}
		if (o->tls_cert_file && o->tls_key_file) {
			char *cert = kvp_wire_read_file(o->tls_cert_file);
			char *key = kvp_wire_read_file(o->tls_key_file);
			int e = cert && key ? nng_tls_config_own_cert(s->tls, cert, key, NULL) : NNG_ENOENT;
			free(cert);
			free(key);
			if (e != 0) {
				kvp_sub_close(s);
				return KVP_EINTERNAL;
			}
		}
		(void)nng_tls_config_auth_mode(s->tls, o->tls_ca_file ? NNG_TLS_AUTH_MODE_REQUIRED
		                                                      : NNG_TLS_AUTH_MODE_NONE);
		(void)nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, s->tls);
	}
	if (nng_dialer_start(d, NNG_FLAG_NONBLOCK) != 0) {
		kvp_sub_close(s);
		return KVP_EINTERNAL;
	}
	for (size_t i = 0; i < n; i++) {
		struct pool_state *ps = &s->pools[i];
		struct kvp_client_options co = rpc_options(s, ps);
		if ((rv = kvp_client_open(&co, &ps->rpc)) != KVP_OK || (rv = resync(s, ps)) != KVP_OK) {
			kvp_sub_close(s);
			return rv;
		}
	}
	*out = s;
	return KVP_OK;
}

int
kvp_sub_get_stats(const struct kvp_sub *s, const char *pool, struct kvp_sub_stats *out)
{
	if (s == NULL || out == NULL)
		return KVP_EINVAL;
	for (size_t i = 0; i < s->num_pools; i++) {
		const struct pool_state *ps = &s->pools[i];
		if (pool != NULL && strcmp(pool, ps->name) != 0)
			continue;
		*out = ps->st;
		out->lag = ps->newest_seen > ps->st.next_seq ? ps->newest_seen - ps->st.next_seq : 0;
		return KVP_OK;
	}
	return KVP_ENOTFOUND;
}

const char *
kvp_sub_last_detail(const struct kvp_sub *s)
{
	return s ? s->detail : "";
}

void
kvp_sub_close(struct kvp_sub *s)
{
	if (s == NULL)
		return;
	nng_close(s->sock);
	if (s->tls)
		nng_tls_config_free(s->tls);
	for (size_t i = 0; s->pools && i < s->num_pools; i++)
		kvp_client_close(s->pools[i].rpc);
	free(s->pools);
	kvp_event_batch_fini(&s->events);
	free(s);
}
