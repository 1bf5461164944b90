/* SPDX-License-Identifier: Apache-2.0 */
/*
 * transport_impl.h: what the RPC transport (transport.c: receive, dispatch,
 * send) shares with its connection watch (transport_conns.c: idle
 * connections, the bounds on unread replies, the pressure watch, failed TLS
 * handshakes). Internal to the daemon.
 */
#ifndef KVPD_TRANSPORT_IMPL_H
#define KVPD_TRANSPORT_IMPL_H

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>
#include <nng/supplemental/util/platform.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "service/config/config_impl.h"
#include "service/net/chan.h"
#include "service/net/conn_bounds.h"
#include "service/log.h"
#include "service/pool/server.h"
#include "service/net/transport.h"
#include "service/rpc/u64map.h"

enum { RECV, SEND };

struct worker {
	struct kvpd_transport *t;
	nng_ctx ctx;
	nng_aio *aio;
	int state;
	nng_pipe pipe;         /* the connection the reply in flight goes to */
	/* While a reply waits for its peer: when the send began (0: none) and the
	 * pipe id, for the pressure watch (another thread) to read. */
	atomic_uint_fast64_t send_at;
	atomic_uint send_pipe;
	atomic_uint_fast64_t send_peer; /* that connection's peer value (conn_bounds.h) */
	struct kvpd_held *held;         /* scratch: the others' unread replies, at a request */
};

/*
 * Context pressure: when at least half the contexts hold replies their
 * peers have not taken for SLOW_SEND_MS, the connection whose reply has
 * waited longest is closed, an unauthenticated one first (conn_bounds.h;
 * its replies fail at once, freeing their
 * contexts), so peers that pipeline and never read cannot keep the rest
 * waiting up to --send-timeout-ms. Honest peers take a reply within
 * milliseconds; a reply slower than this to a peer that is reading (a huge
 * ReadBlocks over a slow link) is cut only while contexts are that scarce.
 */
#define SLOW_SEND_MS 250
#define PRESSURE_TICK_MS 25
/* A reply waiting this long is a non-reader's, for the unauthenticated shares
 * (a reading peer's send completes within microseconds). */
#define STALE_SEND_MS 50

/*
 * The open connections and when each last sent a request (or took a reply):
 * nng pipe id -> that time + 1 (a u64map value is never 0), so the hot path
 * (one update per request) costs two short probes; and each one's peer
 * value (address key, and whether it has shown a pool's token). A
 * connection closed for idling is marked KVPD_CONN_CLOSING until nng says
 * it is gone: nng 1.5 can take long (or forever) to finish a close, and it
 * is closed, counted and logged once.
 */
#define KVPD_CONN_CLOSING UINT64_MAX
struct conns {
	nng_mtx *mu;
	struct kvpd_u64map m;     /* with --idle-timeout-ms only */
	struct kvpd_u64map peers; /* pipe id -> peer value */
};

enum { KVPD_MAX_RETIRED = 16, KVPD_MAX_HUNG = 64 };

struct kvpd_transport {
	struct kvpd_server *srv;
	nng_socket sock;
	nng_listener listeners[KVPD_MAX_URLS]; /* under listen_mu, once open */
	size_t num_listeners;
	char urls[KVPD_MAX_URLS][KVPD_PATH_MAX]; /* listeners[i] listens on urls[i] */
	struct {
		uint64_t errors; /* its error count at the watch's last look */
		bool unproven;   /* not yet seen answering: probed at every look */
		unsigned looks;  /* looks since its last probe */
	} seen[KVPD_MAX_URLS];
	/*
	 * Stuck ipc listeners put aside, not closed: closing one in nng 1.5
	 * closes its connections and was seen to hang nng's reaper for good
	 * (every later close then waits forever). Closed with the socket.
	 */
	nng_listener retired[KVPD_MAX_RETIRED];
	size_t num_retired;
	/*
	 * While any is retired: the connections on an ipc path seen hung up
	 * at the watch's last look (descriptor and inode), which it closes if
	 * they still are at the next (transport_listen.c).
	 */
	struct {
		int fd;
		uint64_t ino;
	} hung[KVPD_MAX_HUNG];
	size_t num_hung;
	uint32_t ipc_mode;
	bool listening;                 /* under listen_mu: false once closing */
	nng_mtx *listen_mu;             /* the listeners, for the watch that renews them */
	nng_cv *listen_cv;              /* wakes the watch to stop */
	nng_thread *listen_thr;         /* the watch (transport_listen.c) */
	nng_tls_config *tls;
	nng_socket pub;
	bool has_pub;
	struct worker *workers;
	size_t num_slots;               /* workers allocated */
	size_t num_workers;             /* ...of which opened */
	atomic_int in_flight;
	atomic_bool closing;
	atomic_uint_fast64_t served;
	nng_duration send_timeout;
	atomic_uint last_cut;           /* the connection last closed for not reading */
	nng_duration idle_timeout;      /* 0: idle connections stay */
	struct conns conns;
	struct kvpd_chans *chans;       /* same-host channels beside the first ipc:// endpoint */
	nng_aio *reaper;                /* wakes to close idle connections */
	nng_aio *pressure;              /* wakes to watch for contexts held by non-readers */
	struct kvpd_held *held;         /* the pressure watch's scratch */
	/* Refusals a peer can cause by the thousand: a few lines a second of each kind. */
	struct kvpd_log_limit refusal_log[KVPD_NUM_REFUSALS];
	uint64_t tls_failed;            /* failed TLS handshakes counted so far (pressure_cb) */
	uint64_t tls_unlogged;          /* ...of which no log line has told yet */
	unsigned tls_ticks;             /* pressure ticks since they were last counted */
	struct kvpd_log_limit tls_log;
};

/* A connection's peer as text: ip:port, [ip6]:port, or the ipc path. */
void kvpd_tr_peer_name(nng_pipe p, char *buf, size_t cap);
/* nng's pipe events: a connection tracked (its peer value, its last request) or forgotten. */
void kvpd_tr_pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg);
/* A request came on p: not idle. Returns its peer value (conn_bounds.h). */
uint64_t kvpd_tr_conn_seen(struct kvpd_transport *t, nng_pipe p);
/* p's peer is busy on a long call: not idle. */
void kvpd_tr_conn_touch(struct kvpd_transport *t, nng_pipe p);
/* p has shown a pool's token: it keeps precedence while it lasts. */
void kvpd_tr_conn_trust(struct kvpd_transport *t, nng_pipe p);
/*
 * Creates and starts listener i on urls[i] (TLS, ipc-mode); 0, or -1 with
 * the reason in err. The listeners' watch: renews one that stopped
 * accepting (transport_listen.c). Both with listen_mu held or before the
 * transport runs.
 */
int kvpd_tr_listen(struct kvpd_transport *t, size_t i, char *err, size_t len);
/* Starts the listeners' watch thread (0, or -1); stops and joins it (also when never started). */
int kvpd_tr_listen_watch_start(struct kvpd_transport *t);
void kvpd_tr_listen_watch_stop(struct kvpd_transport *t);
/* The timers' callbacks: idle connections closed; contexts held by non-readers freed. */
void kvpd_tr_reaper_cb(void *arg);
void kvpd_tr_pressure_cb(void *arg);
/* Closes connection id for reason, counted and logged once (key/val: one more field). */
void kvpd_tr_cut(struct kvpd_transport *t, uint32_t id, enum kvpd_close_reason reason,
                 const char *msg, const char *key, const char *val);
/* Before w's request is served: false when its own connection was closed. */
bool kvpd_tr_within_bounds(struct kvpd_transport *t, struct worker *w, uint64_t peer);

#endif
