/* SPDX-License-Identifier: Apache-2.0 */
/*
 * conn_bounds.h: which connection the transport closes so that peers that
 * do not read cannot hold the request contexts others need (issue #49).
 * Pure decisions over a snapshot of the contexts that hold a reply their
 * peer has not taken; no I/O, no locks, so CTest drives them directly.
 *
 * A connection's peer is a value: its address key (IPv4 address, IPv6 /64
 * prefix; 0 for ipc:// and unknown, which no address bound groups) and
 * whether it has shown a pool's token (an authenticated session). With C
 * contexts:
 *   - one connection holds fewer than C/2 (any peer): a request from one
 *     that holds C/2 closes it (kvpool's clients have one call in flight);
 *   - of the replies that have waited `stale_ms` (a reader takes its reply
 *     within microseconds: these are non-readers'), one unauthenticated
 *     address holds at most max(1, C/4), and all unauthenticated
 *     connections together at most max(1, C/2): a request from an
 *     unauthenticated peer at either share closes the connection in that
 *     scope whose reply has waited longest, then is served, and the
 *     pressure watch closes it when a share is passed without a request;
 * so authenticated sessions always find half the contexts free of
 * unauthenticated non-readers. Behind these, the pressure watch closes the
 * longest waiter once half the contexts have waited `slow_ms`,
 * unauthenticated connections first.
 */
#ifndef KVPD_CONN_BOUNDS_H
#define KVPD_CONN_BOUNDS_H

#include <nng/nng.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "service/pool/server.h"

/* A peer value's flag: the connection has shown a pool's token. */
#define KVPD_PEER_TRUSTED (UINT64_C(1) << 63)

/* A connection's peer value from its remote address (never 0). */
uint64_t kvpd_peer_value(const nng_sockaddr *sa);

/* The address key in a peer value: 0 when no address bound applies. */
uint64_t kvpd_peer_addr(uint64_t peer);

/* A context holding a reply its peer has not taken. */
struct kvpd_held {
	uint64_t since_ms; /* when the send began */
	uint32_t pipe;     /* the connection (nng pipe id) */
	uint64_t peer;     /* its peer value */
};

/* What to do with a request before it is served. */
struct kvpd_bound_verdict {
	uint32_t close;                  /* the connection to close first, or 0 */
	enum kvpd_close_reason reason;   /* why (when close is set) */
	bool serve;                      /* false: the request's own connection goes */
};

/* The bound in force at `now_ms` for a request from pipe `pipe` (peer
 * `peer`), with `contexts` contexts of which held[0..n) hold unread replies
 * (the request's own context is not among them). */
void kvpd_bound_check(const struct kvpd_held *held, size_t n, size_t contexts, uint32_t pipe,
                      uint64_t peer, uint64_t now_ms, uint64_t stale_ms,
                      struct kvpd_bound_verdict *out);

/* The log line for a connection a bound closed (a request's bound, by its reason). */
const char *kvpd_bound_why(enum kvpd_close_reason reason);

/* The pressure watch at `now_ms`: with half the contexts waiting `slow_ms`
 * or more, the connection to close (unauthenticated first, then the
 * longest waiter; *reason KVPD_CLOSE_NO_READ); else, with an
 * unauthenticated address or all of them past their share of replies
 * waiting `stale_ms`, the longest waiter there; 0 for none. *slow (may be
 * NULL) gets how many wait `slow_ms`. */
uint32_t kvpd_pressure_victim(const struct kvpd_held *held, size_t n, size_t contexts,
                              uint64_t now_ms, uint64_t slow_ms, uint64_t stale_ms,
                              size_t *slow, enum kvpd_close_reason *reason);

#endif
