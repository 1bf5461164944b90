/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "clients/c/kvpool.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/tls/tls.h>
#include <nng/supplemental/util/platform.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clients/c/client_impl.h"
#include "clients/c/probe.h"
#include "clients/c/tls.h"
#include "proto/wire.h"

int
kvp_client_fail_(struct kvp_client *c, int status, const char *fmt, const char *arg)
{
	snprintf(c->detail, sizeof(c->detail), fmt, arg ? arg : "");
	return status;
}
/*
 * One round trip: the request is rq packed straight into the message (or
 * the raw bytes req when rq is NULL), sent again, same call id, after a
 * timeout or a connection reset. On KVP_OK *reply is the daemon's message (the caller frees it).
 */
/*
 * Request.deadline_unix_ms for a call sent now: when the client gives up on
 * it, every attempt included. One value for all attempts, so a retry is the
 * same bytes (the daemon tells a retry from a reused call id by them).
 */
uint64_t
kvp_client_deadline_(const struct kvp_client *c)
{
	struct timespec ts;
	if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
		return 0;
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u +
	       (uint64_t)c->timeout_ms * ((uint64_t)c->retries + 1);
}

static void on_pipe(nng_pipe p, nng_pipe_ev ev, void *arg);

static void
client_free(void *arg)
{
	struct kvp_client *c = arg;
	if (c->tls)
		nng_tls_config_free(c->tls);
	nng_cv_free(c->cv);
	nng_mtx_free(c->mtx);
	kvpc_plan_fini(&c->plan);
	free(c->url);
	free(c);
}

/* Drops one reference to c (common/nng_close.h's then for a closed socket). */
static void
client_unref(void *arg)
{
	struct kvp_client *c = arg;
	if (atomic_fetch_sub(&c->refs, 1) == 1)
		client_free(c);
}

/* Closes s, a socket of c's, waiting at most grace_ms; c lives until it is closed. */
static void
sock_close(struct kvp_client *c, nng_socket s, int grace_ms)
{
	if (kvp_nng_close_bounded(s, grace_ms, client_unref, c))
		client_unref(c);
}

/* A REQ socket with c's options, dialing c->url in the background, into *s and *d. */
static int
sock_open(struct kvp_client *c, nng_socket *s, nng_dialer *d)
{
	int rv;

	if (nng_req0_open(s) != 0)
		return kvp_client_fail_(c, KVP_EINTERNAL, "cannot open an nng socket", NULL);
	atomic_fetch_add(&c->refs, 1);
	nng_mtx_lock(c->mtx);
	c->watch_id = s->id; /* a replaced socket's pipes no longer count */
	c->pipes = 0;
	c->lost_at = 0;
	nng_mtx_unlock(c->mtx);
	(void)nng_pipe_notify(*s, NNG_PIPE_EV_ADD_POST, on_pipe, c);
	(void)nng_pipe_notify(*s, NNG_PIPE_EV_REM_POST, on_pipe, c);
	/* Replies can be as large as requests: bound what we accept too. */
	(void)nng_socket_set_size(*s, NNG_OPT_RECVMAXSZ, 64u << 20);
	(void)nng_socket_set_ms(*s, NNG_OPT_RECVTIMEO, (nng_duration)c->timeout_ms);
	(void)nng_socket_set_ms(*s, NNG_OPT_SENDTIMEO, (nng_duration)c->timeout_ms);
	/* We resend ourselves, with the same call id; nng's own resend is off. */
	(void)nng_socket_set_ms(*s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
	(void)nng_socket_set_ms(*s, NNG_OPT_RECONNMINT, 10);
	(void)nng_socket_set_ms(*s, NNG_OPT_RECONNMAXT, 1000);
	if (nng_dialer_create(d, *s, c->url) != 0) {
		rv = kvp_client_fail_(c, KVP_EINVAL, "bad URL %s", c->url);
		goto fail;
	}
	if (c->tls != NULL)
		(void)nng_dialer_set_ptr(*d, NNG_OPT_TLS_CONFIG, c->tls);
	/* Non-blocking: a daemon still starting is retried in the background. */
	if ((rv = nng_dialer_start(*d, NNG_FLAG_NONBLOCK)) != 0) {
		rv = kvp_client_fail_(c, KVP_EINTERNAL, "dial: %s", nng_strerror(rv));
		goto fail;
	}
	return KVP_OK;
fail:
	sock_close(c, *s, KVPC_CLOSE_GRACE_MS);
	return rv;
}

/* c's socket replaced by a fresh one; the old one closes in the background. */
static int
redial(struct kvp_client *c)
{
	nng_socket s, old = c->sock;
	nng_dialer d;
	int rv = sock_open(c, &s, &d);
	nng_mtx_lock(c->mtx);
	c->redialed_at = nng_clock();
	if (rv != KVP_OK)
		c->watch_id = old.id; /* its pipe count is lost: only a loss to come counts */
	nng_mtx_unlock(c->mtx);
	if (rv != KVP_OK)
		return rv;
	c->sock = s;
	c->dialer = d;
	sock_close(c, old, 0);
	return KVP_OK;
}

/*
 * Whether c's socket lost its connection and nng has not made another for
 * KVPC_STUCK_DIAL_MS, nor has c redialed lately: a daemon closing an idle
 * connection was seen to leave nng 1.5's dialer for good, so that a call with
 * retries = 0 timed out where a fresh socket is served at once.
 */
static bool
dial_stuck(struct kvp_client *c)
{
	nng_mtx_lock(c->mtx);
	nng_time now = nng_clock();
	bool stuck = c->pipes == 0 && c->lost_at != 0 && now - c->lost_at > KVPC_STUCK_DIAL_MS &&
	             now - c->redialed_at > KVPC_REDIAL_EVERY_MS;
	nng_mtx_unlock(c->mtx);
	return stuck;
}

/* A varint field; returns its length (at most 11 bytes). */
static size_t
put_varint_field(uint8_t *p, uint32_t field, uint64_t v)
{
	size_t n = 0;
	p[n++] = (uint8_t)(field << 3);
	do {
		p[n++] = (uint8_t)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
		v >>= 7;
	} while (v != 0);
	return n;
}

/*
 * The same-host channel of an ipc:// daemon (chan.h), when the daemon runs
 * as the user the ipc connection showed (SO_PEERCRED) and KVPOOL_SHM is not
 * 0. Tried at open and, once lost, again at most every KVPC_CHAN_RETRY_MS.
 */
static void
chan_try(struct kvp_client *c)
{
	if (!c->chan_wanted || c->chan != NULL || nng_clock() < c->chan_next)
		return;
	c->chan_next = (uint64_t)nng_clock() + KVPC_CHAN_RETRY_MS;
	nng_mtx_lock(c->mtx);
	bool known = c->peer_uid_known;
	uint64_t uid = c->peer_uid;
	nng_mtx_unlock(c->mtx);
	/*
	 * A daemon that answers hands a channel over within milliseconds; one
	 * that is stalled must not cost the call more than a little beyond its
	 * timeout.
	 */
	if (known)
		(void)kvpc_chan_open(c->url + 6, uid,
		                     c->timeout_ms < KVPC_CHAN_OPEN_MS ? c->timeout_ms
		                                                       : KVPC_CHAN_OPEN_MS,
		                     &c->chan);
}

/* The channel failed a call: nng from now on (chan_try asks for a new one later). */
static void
chan_drop(struct kvp_client *c)
{
	kvpc_chan_close(c->chan);
	c->chan = NULL;
}

static int
roundtrip(struct kvp_client *c, const Kvpool__V1__Request *rq, const uint8_t *req, size_t len,
          nng_msg **reply)
{
	int rv = NNG_ETIMEDOUT;

	/*
	 * Appended after the message (the last occurrence of a field wins):
	 * the deadline, and for raw bytes the token as field 4.
	 */
	size_t extra = 0, head = 0;
	uint8_t tail[16];
	if (rq != NULL) {
		len = kvpc_request_size(rq, &c->plan);
	} else if (c->token_len > 0) {
		tail[0] = 4 << 3 | 2;
		tail[1] = (uint8_t)(c->token_len | (c->token_len >= 0x80 ? 0x80 : 0));
		tail[2] = (uint8_t)(c->token_len >> 7);
		head = c->token_len >= 0x80 ? 3 : 2;
	}
	uint8_t *dl = tail + head;
	size_t dl_len = put_varint_field(dl, 5, kvp_client_deadline_(c));
	extra = head + (head ? c->token_len : 0) + dl_len;
	bool redialed = false;
	for (uint32_t attempt = 0; attempt <= c->retries; attempt++) {
		/*
		 * After a timeout the next attempt, of this call or (retries 0)
		 * the next one, goes out on a fresh socket, once a call: nng 1.5's
		 * dialer was seen not to redial after the daemon closed an idle
		 * connection, once other sockets of this process hung in nng_close
		 * (a daemon paused while a client gave up dialing).
		 */
		if ((c->redial_next || (attempt == 0 && dial_stuck(c))) && !redialed) {
			redialed = true;
			if (redial(c) == KVP_OK)
				c->redial_next = false;
		}
		nng_msg *msg;
		if (nng_msg_alloc(&msg, len + extra) != 0)
			return kvp_client_fail_(c, KVP_ENOMEM, "out of memory", NULL);
		uint8_t *body = nng_msg_body(msg);
		if (rq != NULL && kvpc_request_pack(rq, &c->plan, body) != len) {
			nng_msg_free(msg); /* our packer's bug: say so rather than send it */
			return kvp_client_fail_(c, KVP_EINTERNAL, "request packed to a wrong length",
			                        NULL);
		} else if (rq == NULL && len > 0)
			memcpy(body, req, len);
		if (head > 0) {
			memcpy(body + len, tail, head);
			memcpy(body + len + head, c->token, c->token_len);
		}
		memcpy(body + len + extra - dl_len, dl, dl_len);
		c->last_sent = len + extra;
		if (attempt == 0 && c->last_ok)
			chan_try(c);
		if (c->chan != NULL) {
			/*
			 * Same host: the very bytes through shared memory. A stalled
			 * daemon counts as a timeout (the next attempt goes over nng,
			 * the same call id running the call once); a gone one, or a
			 * failed channel, sends this attempt over nng.
			 */
			int crv = kvpc_chan_call(c->chan, body, len + extra, c->timeout_ms, reply);
			if (crv == KVP_OK) {
				nng_msg_free(msg);
				c->last_ok = true;
				return KVP_OK;
			}
			if (crv != KVP_EINVAL)
				chan_drop(c);
			if (crv == KVP_EBUSY) {
				nng_msg_free(msg);
				rv = NNG_ETIMEDOUT;
				continue;
			}
		}
		if ((rv = nng_sendmsg(c->sock, msg, 0)) != 0) {
			nng_msg_free(msg);
			if (rv == NNG_ETIMEDOUT) {
				c->redial_next = true;
				continue;
			}
			return kvp_client_fail_(c, KVP_EINTERNAL, "send: %s", nng_strerror(rv));
		}
		/*
		 * A connection closed under the call (the daemon's idle timeout can
		 * fire just as a request leaves; a restart) is retried like a
		 * timeout: nng redials, and the same call id makes a mutating call
		 * run once.
		 */
		if ((rv = nng_recvmsg(c->sock, &msg, 0)) == NNG_ETIMEDOUT || rv == NNG_ECONNRESET) {
			c->redial_next |= rv == NNG_ETIMEDOUT;
			continue;
		}
		if (rv != 0)
			return kvp_client_fail_(c, KVP_EINTERNAL, "receive: %s", nng_strerror(rv));
		*reply = msg;
		c->last_ok = true;
		return KVP_OK;
	}
	c->last_ok = false;
	return kvp_client_fail_(c, KVP_EBUSY, "no reply from the daemon after retries (%s)",
	                        nng_strerror(rv));
}

int
kvp_client_raw(struct kvp_client *c, const uint8_t *req, size_t len, uint8_t **reply,
               size_t *reply_len)
{
	nng_msg *msg;
	int rv;
	if (c == NULL || req == NULL || reply == NULL || reply_len == NULL)
		return KVP_EINVAL;
	if ((rv = roundtrip(c, NULL, req, len, &msg)) != KVP_OK)
		return rv;
	*reply_len = nng_msg_len(msg);
	if ((*reply = malloc(*reply_len ? *reply_len : 1)) == NULL) {
		nng_msg_free(msg);
		return kvp_client_fail_(c, KVP_ENOMEM, "out of memory", NULL);
	}
	memcpy(*reply, nng_msg_body(msg), *reply_len);
	nng_msg_free(msg);
	return KVP_OK;
}

int
kvp_client_send_(struct kvp_client *c, Kvpool__V1__Request *rq, nng_msg **reply)
{
	rq->call_id = c->next_call_id++;
	rq->pool = c->pool;
	rq->session_id = c->session;
	kvp_client_set_token_(c, rq);
	return roundtrip(c, rq, NULL, 0, reply);
}

int
kvp_client_call_(struct kvp_client *c, Kvpool__V1__Request *rq, Kvpool__V1__Reply **out)
{
	nng_msg *msg = NULL;
	int rv;

	if ((rv = kvp_client_send_(c, rq, &msg)) != KVP_OK)
		return rv;
	return kvp_client_decode_(c, rq->call_id, msg, out);
}

int
kvp_client_decode_(struct kvp_client *c, uint64_t call_id, nng_msg *msg, Kvpool__V1__Reply **out)
{
	Kvpool__V1__Reply *r;
	int rv;

	r = kvpool__v1__reply__unpack(NULL, nng_msg_len(msg), nng_msg_body(msg));
	nng_msg_free(msg);
	if (r == NULL)
		return kvp_client_fail_(c, KVP_EINTERNAL, "malformed reply from the daemon", NULL);
	if (r->call_id != call_id && r->call_id != 0) {
		kvpool__v1__reply__free_unpacked(r, NULL);
		return kvp_client_fail_(c, KVP_EINTERNAL, "reply to another call", NULL);
	}
	rv = kvp_wire_status(r->status);
	if (rv != KVP_OK) {
		kvp_client_fail_(c, rv, "%s", r->detail);
		kvpool__v1__reply__free_unpacked(r, NULL);
		return rv;
	}
	c->detail[0] = '\0';
	*out = r;
	return KVP_OK;
}
static int
tls_setup(struct kvp_client *c, const struct kvp_client_options *o)
{
	struct kvp_tls_options t = {.ca_file = o->tls_ca_file, .cert_file = o->tls_cert_file,
	                            .key_file = o->tls_key_file, .server_name = o->tls_server_name,
	                            .insecure = o->tls_insecure};
	char why[512];
	int rv = kvpc_tls_client_config(o->url, &t, &c->tls, why, sizeof(why));
	return rv == KVP_OK ? KVP_OK : kvp_client_fail_(c, rv, "%s", why);
}

static _Thread_local char open_detail[512];

const char *
kvp_client_open_detail(void)
{
	return open_detail;
}

static void
on_pipe(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	struct kvp_client *c = arg;
	uint64_t uid = 0;
	bool known = nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_UID, &uid) == 0;
	nng_mtx_lock(c->mtx);
	if (nng_pipe_socket(p).id == c->watch_id) {
		if (ev == NNG_PIPE_EV_REM_POST) {
			c->pipes -= c->pipes > 0;
			c->lost_at = nng_clock();
			nng_mtx_unlock(c->mtx);
			return;
		}
		c->pipes++;
	} else if (ev == NNG_PIPE_EV_REM_POST) {
		nng_mtx_unlock(c->mtx);
		return;
	}
	c->connected = true;
	c->peer_uid_known = known;
	c->peer_uid = uid;
	nng_cv_wake(c->cv);
	nng_mtx_unlock(c->mtx);
}

/*
 * Waits up to ms for the dialer's first connection. Without one, nothing
 * would answer: say so now rather than after every retry of Hello.
 */
static int
wait_connected(struct kvp_client *c, const struct kvp_client_options *o, uint32_t ms)
{
	const char *url = o->url;
	nng_time until = nng_clock() + ms;
	bool up;
	nng_mtx_lock(c->mtx);
	while (!c->connected && nng_cv_until(c->cv, until) != NNG_ETIMEDOUT)
		;
	up = c->connected;
	nng_mtx_unlock(c->mtx);
	if (up)
		return KVP_OK;
	/* Over TLS a refused handshake looks the same from here: OpenSSL names it. */
	if (c->tls != NULL) {
		struct kvp_tls_options t = {.ca_file = o->tls_ca_file, .cert_file = o->tls_cert_file,
		                            .key_file = o->tls_key_file,
		                            .server_name = o->tls_server_name,
		                            .insecure = o->tls_insecure};
		char reason[384];
		if (kvpc_tls_diagnose(url, &t, kvpc_tls_ca_path(&t), reason, sizeof(reason))) {
			snprintf(c->detail, sizeof(c->detail), "TLS handshake with %s failed: %s", url,
			         reason);
			return KVP_EUNAVAILABLE;
		}
	}
	int why = c->tls != NULL ? kvpc_tls_probe(url, c->tls) : NNG_ECONNREFUSED;
	if (why == NNG_ECRYPTO || why == NNG_EPEERAUTH) {
		snprintf(c->detail, sizeof(c->detail),
		         "TLS handshake with %s failed: %s (is the daemon's certificate signed by the CA "
		         "given, for the server name asked? does it want a client certificate?)",
		         url, nng_strerror(why));
		return KVP_EUNAVAILABLE;
	}
	/* Something may listen and yet complete no connection: one plain connect tells. */
	int probe = kvpc_listen_probe(url, 1000);
	if (probe == 2) {
		snprintf(c->detail, sizeof(c->detail),
		         "cannot connect to %s: its host name does not resolve (check the name, and "
		         "DNS)", url);
		return KVP_EUNAVAILABLE;
	}
	if (probe == 1) {
		snprintf(c->detail, sizeof(c->detail),
		         "cannot connect to %s within %u ms: something listens there but completed "
		         "no connection (a kvpoold at its open-files limit or too busy to accept: see "
		         "its log; or not a kvpoold)", url, ms);
		return KVP_EUNAVAILABLE;
	}
	snprintf(c->detail, sizeof(c->detail),
	         "cannot connect to %s within %u ms: no kvpoold listening (is it running?)", url, ms);
	return KVP_EUNAVAILABLE;
}

/* Resumes a session: a Heartbeat checks it and brings the pool's description. */
static int
resume(struct kvp_client *c, uint64_t session_id)
{
	Kvpool__V1__Request hq = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__HeartbeatRequest hb = KVPOOL__V1__HEARTBEAT_REQUEST__INIT;
	Kvpool__V1__Reply *hr = NULL;
	int rv;

	c->session = session_id;
	hb.with_pool_info = true;
	hq.call_case = KVPOOL__V1__REQUEST__CALL_HEARTBEAT;
	hq.heartbeat = &hb;
	if ((rv = kvp_client_call_(c, &hq, &hr)) != KVP_OK)
		return rv;
	if (hr->result_case == KVPOOL__V1__REPLY__RESULT_HEARTBEAT) {
		Kvpool__V1__HelloReply h = KVPOOL__V1__HELLO_REPLY__INIT;
		h.session_id = session_id;
		h.lease_ms = hr->heartbeat->lease_ms;
		h.pool = hr->heartbeat->pool;
		kvpc_copy_info(c, &h);
	}
	kvpool__v1__reply__free_unpacked(hr, NULL);
	c->info.session_id = session_id;
	if (c->info.pool[0] == '\0')
		snprintf(c->info.pool, sizeof(c->info.pool), "%s", c->pool);
	return KVP_OK;
}

/* Opens a new session with Hello, ending the session replaces (0: none) in the same call. */
static int
hello(struct kvp_client *c, uint64_t replaces)
{
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__HelloRequest h = KVPOOL__V1__HELLO_REQUEST__INIT;
	Kvpool__V1__Reply *r = NULL;
	char token[sizeof(c->token) + 1];
	int rv;

	memcpy(token, c->token, c->token_len);
	token[c->token_len] = '\0';
	h.protocol_version = KVP_PROTOCOL_VERSION;
	h.auth_token = token;
	h.client_name = c->client_name;
	h.vllm_pod = c->vllm_pod;
	h.lease_ms = c->lease_ms;
	h.replaces = replaces;
	rq.call_case = KVPOOL__V1__REQUEST__CALL_HELLO;
	rq.hello = &h;
	if ((rv = kvp_client_call_(c, &rq, &r)) != KVP_OK)
		return rv;
	if (r->result_case != KVPOOL__V1__REPLY__RESULT_HELLO) {
		kvpool__v1__reply__free_unpacked(r, NULL);
		return KVP_EINTERNAL;
	}
	kvpc_copy_info(c, r->hello);
	c->session = r->hello->session_id;
	kvpool__v1__reply__free_unpacked(r, NULL);
	return KVP_OK;
}

int
kvp_client_open(const struct kvp_client_options *o, struct kvp_client **out)
{
	struct kvp_client *c;
	int rv;

	open_detail[0] = '\0';
	if (o == NULL || o->url == NULL || out == NULL) {
		snprintf(open_detail, sizeof(open_detail), "no options, URL or result pointer");
		return KVP_EINVAL;
	}
	if (o->pool && strlen(o->pool) >= KVP_WIRE_MAX_NAME) {
		snprintf(open_detail, sizeof(open_detail), "pool name longer than %d bytes",
		         KVP_WIRE_MAX_NAME - 1);
		return KVP_EINVAL;
	}
	if (o->token && strlen(o->token) > 255) {
		/* A daemon's token is at most 255 bytes: this one can match none. */
		snprintf(open_detail, sizeof(open_detail), "token longer than 255 bytes");
		return KVP_EINVAL;
	}
	if (o->vllm_pod && strlen(o->vllm_pod) >= sizeof(((struct kvp_client *)0)->vllm_pod)) {
		snprintf(open_detail, sizeof(open_detail), "vllm_pod longer than 63 bytes");
		return KVP_EINVAL;
	}
	if ((c = calloc(1, sizeof(*c))) == NULL) {
		snprintf(open_detail, sizeof(open_detail), "out of memory");
		return KVP_ENOMEM;
	}
	if (o->token != NULL) {
		c->token_len = strlen(o->token);
		memcpy(c->token, o->token, c->token_len);
	}
	snprintf(c->pool, sizeof(c->pool), "%s", o->pool ? o->pool : "default");
	snprintf(c->client_name, sizeof(c->client_name), "%s",
	         o->client_name ? o->client_name : "libkvpool");
	snprintf(c->vllm_pod, sizeof(c->vllm_pod), "%s", o->vllm_pod ? o->vllm_pod : "");
	c->lease_ms = o->lease_ms;
	c->timeout_ms = o->timeout_ms ? o->timeout_ms : 5000;
	c->retries = o->retries == KVP_RETRIES_DEFAULT ? 2 : o->retries;
	c->next_call_id = ((uint64_t)nng_random() << 32 | nng_random()) | 1;
	atomic_init(&c->refs, 1); /* the owner's */
	if (nng_mtx_alloc(&c->mtx) != 0 || nng_cv_alloc(&c->cv, c->mtx) != 0 ||
	    (c->url = strdup(o->url)) == NULL) {
		if (c->cv)
			nng_cv_free(c->cv);
		if (c->mtx)
			nng_mtx_free(c->mtx);
		free(c);
		snprintf(open_detail, sizeof(open_detail), "out of memory");
		return KVP_ENOMEM;
	}
	if (strncmp(o->url, "tls+", 4) == 0 && (rv = tls_setup(c, o)) != KVP_OK)
		goto fail;
	if ((rv = sock_open(c, &c->sock, &c->dialer)) != KVP_OK)
		goto fail;
	c->has_sock = true;
	uint32_t wait_ms = o->connect_timeout_ms ? o->connect_timeout_ms
	                                         : c->timeout_ms * (c->retries + 1);
	if ((rv = wait_connected(c, o, wait_ms)) != KVP_OK)
		goto fail;
	if ((rv = o->session_id != 0 ? resume(c, o->session_id) : hello(c, 0)) != KVP_OK)
		goto fail;
	const char *shm = getenv("KVPOOL_SHM");
	c->chan_wanted = strncmp(c->url, "ipc://", 6) == 0 && !(shm != NULL && strcmp(shm, "0") == 0);
	c->last_ok = true;
	chan_try(c);
	*out = c;
	return KVP_OK;
fail:
	snprintf(open_detail, sizeof(open_detail), "%s", c->detail[0] ? c->detail : kvp_strerror(rv));
	kvp_client_detach(c);
	return rv;
}

void
kvp_client_set_token_(const struct kvp_client *c, Kvpool__V1__Request *rq)
{
	rq->token.data = (uint8_t *)c->token;
	rq->token.len = c->token_len;
}

void
kvp_client_detach(struct kvp_client *c)
{
	if (c == NULL)
		return;
	/* The token leaves no copy in freed memory. */
	volatile uint8_t *t = c->token;
	for (size_t i = 0; i < sizeof(c->token); i++)
		t[i] = 0;
	chan_drop(c);
	/* After the close no pipe callback runs: only then may c go. */
	if (c->has_sock)
		sock_close(c, c->sock, KVPC_CLOSE_GRACE_MS);
	client_unref(c);
}

void
kvp_client_close(struct kvp_client *c)
{
	if (c == NULL)
		return;
	if (c->session != 0) {
		Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
		Kvpool__V1__GoodbyeRequest g = KVPOOL__V1__GOODBYE_REQUEST__INIT;
		Kvpool__V1__Reply *r = NULL;
		rq.call_case = KVPOOL__V1__REQUEST__CALL_GOODBYE;
		rq.goodbye = &g;
		c->retries = 0; /* best effort: the lease cleans up otherwise */
		if (kvp_client_call_(c, &rq, &r) == KVP_OK)
			kvpool__v1__reply__free_unpacked(r, NULL);
	}
	kvp_client_detach(c);
}

int
kvp_client_renew(struct kvp_client *c)
{
	if (c == NULL)
		return KVP_EINVAL;
	uint64_t old = c->session;
	c->session = 0; /* Hello names no session */
	int rv = hello(c, old);
	if (rv != KVP_OK)
		c->session = old; /* its fate unknown: a later call says (UNAUTHENTICATED if it ended) */
	return rv;
}

const struct kvp_client_info *
kvp_client_info(const struct kvp_client *c)
{
	return &c->info;
}

const char *
kvp_client_last_detail(const struct kvp_client *c)
{
	return c ? c->detail : "";
}

bool
kvp_client_event_key_(const struct kvp_client *c, struct kvp_seal_key *out)
{
	if (c == NULL || out == NULL || !c->has_event_key)
		return false;
	*out = c->event_key;
	return true;
}
