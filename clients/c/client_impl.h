/* SPDX-License-Identifier: Apache-2.0 */
/*
 * client_impl.h: the client's state, its one call primitive and the
 * request builders, shared by the files of libkvpool (client.c: the
 * connection; blocks.c, requests.c: the calls; batch.c: batches; data.c:
 * the data plane). Internal: not installed, not for applications.
 */
#ifndef KVPOOL_CLIENT_IMPL_H
#define KVPOOL_CLIENT_IMPL_H

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>
#include <stdatomic.h>
#include <nng/supplemental/util/platform.h>
#include <stdbool.h>

#include "clients/c/kvpool.h"
#include "clients/c/chan.h"
#include "clients/c/request_pack.h"
#include "kvpool.pb-c.h"
#include "proto/event_seal.h"
#include "proto/wire.h"
#include "common/nng_close.h"

/* How long closing a client or subscriber waits for nng (common/nng_close.h). */
enum { KVPC_CLOSE_GRACE_MS = 1000 };
/*
 * How long a socket may stay without a connection after losing one before a
 * call replaces it (nng redials a lost connection after 10 ms; nng 1.5 was
 * seen never to), and how often at most (a daemon that is down is not
 * redialed on every call).
 */
enum { KVPC_STUCK_DIAL_MS = 250, KVPC_REDIAL_EVERY_MS = 2000 };

struct kvp_client {
	nng_socket sock;
	nng_dialer dialer;
	nng_tls_config *tls;
	/* The daemon's URL: a call that times out redials it on a fresh socket. */
	char *url;
	/*
	 * References to this struct: the owner's, and one per nng socket whose
	 * pipe callback may still run (a replaced socket closes in the
	 * background). The last one frees it.
	 */
	atomic_int refs;
	bool has_sock;    /* sock is open */
	bool redial_next; /* a call timed out: the next attempt goes out on a fresh socket */
	char pool[KVP_WIRE_MAX_NAME];
	uint64_t session;
	uint64_t next_call_id;
	/* The pool's token, sent on every call (the daemon checks each, not only Hello). */
	uint8_t token[256];
	size_t token_len;
	uint32_t timeout_ms, retries;
	/* Hello's other fields, kept for kvp_client_renew. */
	char client_name[64], vllm_pod[64];
	uint32_t lease_ms;
	size_t last_sent;           /* bytes of the last request sent */
	struct kvp_client_info info;
	char detail[512];
	/* Set by the pipe callback when a connection is up (kvp_client_open waits on it). */
	nng_mtx *mtx;
	nng_cv *cv;
	bool connected;
	/*
	 * The daemon's user, from the kernel (SO_PEERCRED) over an ipc://
	 * connection, under mtx: the owner its region file must have.
	 */
	bool peer_uid_known;
	uint64_t peer_uid;
	/*
	 * The current socket's connections, under mtx: how many are up, and
	 * when the last one went (0: none lost since it was opened). A socket
	 * left without one past KVPC_STUCK_DIAL_MS is replaced before a call.
	 */
	uint32_t watch_id; /* the socket whose pipes these are */
	uint32_t pipes;
	nng_time lost_at, redialed_at;
	/* The pool's event-stream key (a pool with a token), from its PoolInfo. */
	struct kvp_seal_key event_key;
	bool has_event_key;
	/* The daemon runs a Batch's slots runs (PoolInfo); else batches send plain calls. */
	bool slots_runs;
	/* A Batch request's lengths, from measuring it to writing it (request_pack.h). */
	struct kvpc_plan plan;
	/*
	 * The same-host channel (chan.h) of an ipc:// daemon, NULL while calls
	 * go over nng; a lost one is asked for again at most every
	 * KVPC_CHAN_RETRY_MS (chan_next: when).
	 */
	struct kvpc_chan *chan;
	bool chan_wanted;
	bool last_ok; /* the last call was answered: the daemon is there to ask */
	uint64_t chan_next;
};

/* How often a lost channel is asked for again; how long the handover may take. */
#define KVPC_CHAN_RETRY_MS 2000
#define KVPC_CHAN_OPEN_MS 100

/* Keeps what a Hello reply says of the session and its pool (info.c). */
void kvpc_copy_info(struct kvp_client *c, const Kvpool__V1__HelloReply *h);

/* Sets the detail (fmt with one %s for arg) and returns status. */
int kvp_client_fail_(struct kvp_client *c, int status, const char *fmt, const char *arg);

/*
 * Sends rq (call id, pool and session filled here) and unpacks the reply.
 * On KVP_OK the caller owns *out (kvpool__v1__reply__free_unpacked); on an
 * error status from the daemon, *out is freed and the detail is set.
 */
int kvp_client_call_(struct kvp_client *c, Kvpool__V1__Request *rq, Kvpool__V1__Reply **out);

/*
 * Sends rq (envelope filled here) and returns the daemon's reply message
 * undecoded (the caller frees it), for replies parsed in place.
 */
int kvp_client_send_(struct kvp_client *c, Kvpool__V1__Request *rq, nng_msg **reply);

/* Puts the client's token (if any) in rq's envelope. */
void kvp_client_set_token_(const struct kvp_client *c, Kvpool__V1__Request *rq);

/* Decodes a reply message as kvp_client_call_ does (and frees the message). */
int kvp_client_decode_(struct kvp_client *c, uint64_t call_id, nng_msg *msg,
                       Kvpool__V1__Reply **out);

/* Declares rq and rv and makes the call: rq.field = msg, reply in r. */
#define KVP_CLIENT_CALL(c, field, CASE, msg, r)                       \
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;           \
	rq.call_case = KVPOOL__V1__REQUEST__CALL_##CASE;              \
	rq.field = (msg);                                             \
	int rv = kvp_client_call_((c), &rq, &(r))

/* Most multimodal features one request's keys may carry. */
#define KVP_CLIENT_MAX_MM 256

/*
 * The request builders (build.c), one per call with more than ids, shared
 * by the direct and batch paths: m is initialised and filled from the
 * arguments by reference, the keys excepted. KVP_EINVAL for inconsistent
 * arguments (an id array NULL with a count, too many features).
 */
/* dflt: the hash width when the call gives none (the pool's, or 32 in a batch). */
int kvp_build_cache_(Kvpool__V1__CacheRequest *m, const struct kvp_client_cache *a, uint32_t dflt);
int kvp_build_lookup_(Kvpool__V1__LookupRequest *m, const struct kvp_client_lookup *q,
                      uint32_t dflt);
int kvp_build_slots_(Kvpool__V1__AllocateSlotsRequest *m, const struct kvp_client_slots *a);

/* The pool's event-stream key from Hello or a resume; false if it has none (no token). */
bool kvp_client_event_key_(const struct kvp_client *c, struct kvp_seal_key *out);

/* Reply messages to the public structs, shared by the single calls and batches. */
void kvp_client_stats_from_(const Kvpool__V1__StatsReply *s, struct kvp_client_stats *out);
void kvp_client_slots_from_(const Kvpool__V1__AllocateSlotsReply *s,
                            struct kvp_client_slots_result *out);

/*
 * Request.deadline_unix_ms for a call sent now: when this client gives up
 * on it (timeout_ms x (retries + 1) from now, by the wall clock).
 */
uint64_t kvp_client_deadline_(const struct kvp_client *c);

#endif /* KVPOOL_CLIENT_IMPL_H */
