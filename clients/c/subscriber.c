#include "subscriber.h"

#include <nng/nng.h>
#include <nng/protocol/pubsub0/sub.h>
#include <nng/supplemental/tls/tls.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

struct kvp_sub {
	struct kvp_sub_options o;
	struct kvp_sub_handler h;
	char pool[KVP_WIRE_MAX_NAME];
	char topic[KVP_WIRE_MAX_NAME + 1];
	size_t topic_len;
	nng_socket sock;
	nng_tls_config *tls;
	struct kvp_client *rpc;
	struct kvp_event_batch events;
	struct kvp_sub_stats st;
	char detail[256];
	int replay_failed;          /* a batch in a replay did not decode */
	uint64_t newest_seen;       /* the highest seq seen on the stream, plus one */
};

/* Reopens the RPC session if the daemon no longer knows it (restart). */
static int
rpc_again(struct kvp_sub *s, int rv)
{
	if (rv != KVP_EUNAUTH)
		return rv;
	struct kvp_client_options co = {
		.url = s->o.rpc_url, .pool = s->pool, .token = s->o.token,
		.client_name = "kvp-subscriber", .timeout_ms = s->o.timeout_ms,
		.lease_ms = 86400000u, /* it holds no blocks: a long lease costs nothing */
		.tls_ca_file = s->o.tls_ca_file, .tls_cert_file = s->o.tls_cert_file,
		.tls_key_file = s->o.tls_key_file, .tls_server_name = s->o.tls_server_name,
	};
	struct kvp_client *c = NULL;
	if ((rv = kvp_client_open(&co, &c)) != KVP_OK)
		return rv;
	kvp_client_detach(s->rpc);
	s->rpc = c;
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
resync(struct kvp_sub *s)
{
	struct kvp_snapshot *snap = NULL;
	int rv = kvp_client_snapshot(s->rpc, &snap);
	if (rv != KVP_OK && rpc_again(s, rv) == KVP_EBUSY)
		rv = kvp_client_snapshot(s->rpc, &snap);
	if (rv != KVP_OK) {
		snprintf(s->detail, sizeof(s->detail), "snapshot: %s", kvp_client_last_detail(s->rpc));
		return rv;
	}
	s->st.epoch = snap->epoch;
	s->st.next_seq = snap->next_seq;
	s->st.resets++;
	if (s->h.reset)
		s->h.reset(s->h.ctx, snap->epoch, snap->next_seq, snap->entries, snap->num_entries);
	kvp_snapshot_free(snap);
	return KVP_OK;
}

static void
deliver(struct kvp_sub *s, uint64_t seq, uint64_t ts)
{
	if (s->h.batch)
		s->h.batch(s->h.ctx, s->st.epoch, seq, ts, &s->events);
	s->st.next_seq = seq + 1;
	s->st.batches++;
}

static void
replayed(void *ctx, const uint8_t *bytes, size_t len)
{
	struct kvp_sub *s = ctx;
	uint64_t epoch, seq, ts;

	bool tick;
	if (s->replay_failed)
		return;
	if (decode_batch(bytes, len, &epoch, &seq, &ts, &tick, &s->events) != KVP_OK || tick ||
	    epoch != s->st.epoch || seq != s->st.next_seq) {
		s->replay_failed = 1; /* out of order or corrupt: fall back to a snapshot */
		return;
	}
	deliver(s, seq, ts);
	s->st.replayed++;
}

/* Fills [next_seq, upto) by Replay, or resynchronises from a Snapshot. */
static int
repair(struct kvp_sub *s, uint64_t upto)
{
	bool available = false;
	uint64_t next = 0;
	int rv;

	s->st.gaps++;
	s->replay_failed = 0;
	rv = kvp_client_replay(s->rpc, s->st.epoch, s->st.next_seq, &available, &next, replayed, s);
	if (rv != KVP_OK && rpc_again(s, rv) == KVP_EBUSY)
		rv = kvp_client_replay(s->rpc, s->st.epoch, s->st.next_seq, &available, &next, replayed,
		                       s);
	if (rv != KVP_OK) {
		snprintf(s->detail, sizeof(s->detail), "replay: %s", kvp_client_last_detail(s->rpc));
		return rv;
	}
	if (!available || s->replay_failed || s->st.next_seq < upto)
		return resync(s);
	return KVP_OK;
}

static int
handle(struct kvp_sub *s, const uint8_t *body, size_t len)
{
	const uint8_t *bytes;
	uint64_t epoch, seq, ts;
	bool tick;
	int rv;

	if (len < s->topic_len || memcmp(body, s->topic, s->topic_len) != 0)
		return KVP_OK; /* another pool's */
	bytes = body + s->topic_len;
	len -= s->topic_len;
	if ((rv = decode_batch(bytes, len, &epoch, &seq, &ts, &tick, &s->events)) != KVP_OK) {
		snprintf(s->detail, sizeof(s->detail), "a published batch did not decode");
		return rv;
	}
	/* A tick carries no events; its seq is the next batch's. */
	uint64_t newest = tick ? seq : seq + 1;
	if (newest > s->newest_seen)
		s->newest_seen = newest;
	if (epoch != s->st.epoch) {
		/* The daemon restarted (or we started before it): start over. */
		if ((rv = resync(s)) != KVP_OK || tick || epoch != s->st.epoch)
			return rv; /* a tick, or an old epoch's straggler */
		if ((rv = decode_batch(bytes, len, &epoch, &seq, &ts, &tick, &s->events)) != KVP_OK)
			return rv;
	}
	if (tick)
		return seq > s->st.next_seq ? repair(s, seq) : KVP_OK;
	if (seq < s->st.next_seq)
		return KVP_OK; /* already applied (replayed, or in the snapshot) */
	if (seq > s->st.next_seq) {
		if ((rv = repair(s, seq)) != KVP_OK)
			return rv;
		if (seq < s->st.next_seq || epoch != s->st.epoch)
			return KVP_OK;
		if (seq > s->st.next_seq)
			return resync(s);
		/* The repair used s->events: decode this batch again. */
		if ((rv = decode_batch(bytes, len, &epoch, &seq, &ts, &tick, &s->events)) != KVP_OK)
			return rv;
	}
	deliver(s, seq, ts);
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
	struct kvp_sub *s;
	int rv;

	if (o == NULL || h == NULL || out == NULL || o->events_url == NULL || o->rpc_url == NULL ||
	    (o->pool && strlen(o->pool) >= KVP_WIRE_MAX_NAME))
		return KVP_EINVAL;
	if ((s = calloc(1, sizeof(*s))) == NULL)
		return KVP_ENOMEM;
	s->o = *o;
	s->h = *h;
	snprintf(s->pool, sizeof(s->pool), "%s", o->pool ? o->pool : "default");
	s->topic_len = strlen(s->pool) + 1;
	memcpy(s->topic, s->pool, s->topic_len);
	kvp_event_batch_init(&s->events);
	if (nng_sub0_open(&s->sock) != 0) {
		free(s);
		return KVP_EINTERNAL;
	}
	(void)nng_socket_set_int(s->sock, NNG_OPT_RECVBUF, o->recv_buffer ? o->recv_buffer : 8192);
	(void)nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, 64u << 20);
	(void)nng_socket_set_ms(s->sock, NNG_OPT_RECONNMINT, 10);
	(void)nng_socket_set_ms(s->sock, NNG_OPT_RECONNMAXT, 1000);
	if (nng_socket_set(s->sock, NNG_OPT_SUB_SUBSCRIBE, s->topic, s->topic_len) != 0) {
		kvp_sub_close(s);
		return KVP_EINTERNAL;
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
	struct kvp_client_options co = {
		.url = o->rpc_url, .pool = s->pool, .token = o->token, .client_name = "kvp-subscriber",
		.timeout_ms = o->timeout_ms, .lease_ms = 86400000u, .tls_ca_file = o->tls_ca_file,
		.tls_cert_file = o->tls_cert_file, .tls_key_file = o->tls_key_file,
		.tls_server_name = o->tls_server_name,
	};
	if ((rv = kvp_client_open(&co, &s->rpc)) != KVP_OK || (rv = resync(s)) != KVP_OK) {
		kvp_sub_close(s);
		return rv;
	}
	*out = s;
	return KVP_OK;
}

void
kvp_sub_get_stats(const struct kvp_sub *s, struct kvp_sub_stats *out)
{
	*out = s->st;
	out->lag = s->newest_seen > s->st.next_seq ? s->newest_seen - s->st.next_seq : 0;
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
	kvp_client_close(s->rpc);
	kvp_event_batch_fini(&s->events);
	free(s);
}
