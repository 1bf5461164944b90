/* SPDX-License-Identifier: Apache-2.0 */
#include "clients/c/subscriber.h"

#include <nng/nng.h>
#include <nng/protocol/pubsub0/sub.h>
#include <nng/supplemental/tls/tls.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/c/client_impl.h"
#include "clients/c/tls.h"
#include "proto/event_seal.h"
#include "proto/event_wire.h"
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
	uint8_t *plain;                     /* the last sealed batch, opened */
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
		.connect_timeout_ms = s->o.connect_timeout_ms, .tls_insecure = s->o.tls_insecure,
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

int
kvp_event_batch_decode(const uint8_t *bytes, size_t len, uint64_t *epoch, uint64_t *seq,
                       uint64_t *ts_unix_ns, struct kvp_event_batch *out)
{
	struct kvp_wire_batch_hdr h;

	if (bytes == NULL || out == NULL || epoch == NULL || seq == NULL)
		return KVP_EINVAL;
	int rv = kvp_wire_events_decode(bytes, len, &h, out);
	*epoch = h.epoch;
	*seq = h.seq;
	if (rv == KVP_OK && ts_unix_ns)
		*ts_unix_ns = h.ts_unix_ns;
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
	/* A new epoch's seqs start again: what was seen of the old one says nothing of lag. */
	if (snap->epoch != ps->st.epoch || ps->newest_seen < snap->next_seq)
		ps->newest_seen = snap->next_seq;
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
	struct kvp_wire_batch_hdr h;

	if (s->replay_failed)
		return;
	if (kvp_wire_events_decode(bytes, len, &h, &s->events) != KVP_OK || h.tick ||
	    h.epoch != ps->st.epoch || h.seq != ps->st.next_seq) {
		s->replay_failed = 1; /* out of order or corrupt: fall back to a snapshot */
		return;
	}
	deliver(s, ps, h.seq, h.ts_unix_ns);
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

/*
 * Opens a sealed batch (a pool with a token) with the key its session got;
 * when the batch names another key (the daemon restarted and drew a new
 * one), reopens the session once for the new key. *bytes and *len then
 * point at the batch in clear (s->plain).
 */
static int
unseal(struct kvp_sub *s, struct pool_state *ps, const uint8_t **bytes, size_t *len)
{
	for (int attempt = 0; attempt < 2; attempt++) {
		struct kvp_seal_key k;
		uint8_t *plain = NULL;
		size_t n = 0;
		uint32_t id = 0;
		int rv = KVP_ENOTFOUND;
		if (kvp_client_event_key_(ps->rpc, &k))
			rv = kvp_seal_open(&k, *bytes, *len, &plain, &n, &id);
		if (rv == KVP_OK) {
			free(s->plain);
			s->plain = plain;
			*bytes = plain;
			*len = n;
			return KVP_OK;
		}
		if (rv != KVP_ENOTFOUND || attempt > 0) {
			snprintf(s->detail, sizeof(s->detail),
			         "%s: a sealed batch (key %08x) cannot be opened with this session's "
			         "key: %s", ps->name, id, kvp_strerror(rv));
			return rv == KVP_ENOTFOUND ? KVP_EUNAUTH : rv;
		}
		if ((rv = rpc_again(s, ps, KVP_EUNAUTH)) != KVP_EBUSY) {
			snprintf(s->detail, sizeof(s->detail), "%s: reopening the session for the "
			         "stream's new key: %s", ps->name, kvp_client_open_detail());
			return rv;
		}
	}
	return KVP_EUNAUTH;
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
	struct kvp_wire_batch_hdr h;
	int rv;

	if (ps == NULL)
		return KVP_OK; /* a pool we do not follow */
	bytes = body + ps->topic_len;
	len -= ps->topic_len;
	rv = kvp_wire_events_decode(bytes, len, &h, &s->events);
	if (rv == KVP_EUNAUTH && (rv = unseal(s, ps, &bytes, &len)) != KVP_OK)
		return rv;
	if (rv == KVP_OK && bytes == s->plain)
		rv = kvp_wire_events_decode(bytes, len, &h, &s->events);
	if (rv != KVP_OK) {
		snprintf(s->detail, sizeof(s->detail), "%s: a published batch did not decode",
		         ps->name);
		return rv;
	}
	if (h.epoch != ps->st.epoch) {
		/* The daemon restarted (or we started before it): start over. */
		if ((rv = resync(s, ps)) != KVP_OK || h.tick || h.epoch != ps->st.epoch)
			return rv; /* a tick, or an old epoch's straggler */
		if ((rv = kvp_wire_events_decode(bytes, len, &h, &s->events)) != KVP_OK)
			return rv;
	}
	/* A tick carries no events; its seq is the next batch's. Only this epoch's count. */
	uint64_t newest = h.tick ? h.seq : h.seq + 1;
	if (newest > ps->newest_seen)
		ps->newest_seen = newest;
	if (h.tick)
		return h.seq > ps->st.next_seq ? repair(s, ps, h.seq) : KVP_OK;
	if (h.seq < ps->st.next_seq)
		return KVP_OK; /* already applied (replayed, or in the snapshot) */
	if (h.seq > ps->st.next_seq) {
		if ((rv = repair(s, ps, h.seq)) != KVP_OK)
			return rv;
		if (h.seq < ps->st.next_seq || h.epoch != ps->st.epoch)
			return KVP_OK;
		if (h.seq > ps->st.next_seq)
			return resync(s, ps);
		/* The repair used s->events: decode this batch again. */
		if ((rv = kvp_wire_events_decode(bytes, len, &h, &s->events)) != KVP_OK)
			return rv;
	}
	deliver(s, ps, h.seq, h.ts_unix_ns);
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
		struct kvp_tls_options t = {.ca_file = o->tls_ca_file, .cert_file = o->tls_cert_file,
		                            .key_file = o->tls_key_file,
		                            .server_name = o->tls_server_name,
		                            .insecure = o->tls_insecure};
		char why[512];
		if ((rv = kvpc_tls_client_config(o->events_url, &t, &s->tls, why, sizeof(why))) != KVP_OK) {
			kvp_sub_close(s);
			return rv;
		}
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
kvp_sub_fd(struct kvp_sub *s, int *fd)
{
	int v;
	if (s == NULL || fd == NULL)
		return KVP_EINVAL;
	if (nng_socket_get_int(s->sock, NNG_OPT_RECVFD, &v) != 0)
		return KVP_EINTERNAL;
	*fd = v;
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

static void
tls_free(void *cfg)
{
	if (cfg != NULL)
		nng_tls_config_free(cfg);
}

void
kvp_sub_close(struct kvp_sub *s)
{
	if (s == NULL)
		return;
	/* The dialer holds the TLS configuration until the close ends. */
	if (kvp_nng_close_bounded(s->sock, KVPC_CLOSE_GRACE_MS, tls_free, s->tls) && s->tls)
		nng_tls_config_free(s->tls);
	for (size_t i = 0; s->pools && i < s->num_pools; i++)
		kvp_client_close(s->pools[i].rpc);
	free(s->plain);
	free(s->pools);
	kvp_event_batch_fini(&s->events);
	free(s);
}
