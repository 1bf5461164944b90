/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A close of an nng socket that cannot hang its caller.
 *
 * nng 1.5 (Debian 12) can hang in nng_close when a socket closes while a
 * peer is still sending: an aio stopped between its begin and its schedule
 * never completes (nanomsg/nng#1813, fixed in nng 1.8). Both the daemon (asked
 * to stop) and the client library (closing under a program's feet) must
 * return, so the close runs on a thread of its own and is waited for at most
 * a grace period. Past it the caller goes on; the close keeps running and,
 * if nng ever finishes it, calls the caller's `then` to free what nng could
 * still have touched.
 *
 * Thread-safe (each call is independent). Needs nng and pthreads; it is a
 * target of its own (kvp_nng_util) so that the engine, which links
 * kvp_common, never links nng.
 */
#ifndef KVP_COMMON_NNG_CLOSE_H
#define KVP_COMMON_NNG_CLOSE_H

#include <stdbool.h>

#include <nng/nng.h>

/*
 * Closes s, waiting at most grace_ms (>= 0). Returns true when the close has
 * finished (then(arg) is not called: the caller frees what it likes), false
 * when it has not: the caller must leave alone whatever nng may still touch
 * and hand it to then(arg), which the close calls on its own thread when it
 * ends (then may be NULL). Where no thread can be started the close runs on
 * the caller's thread, unbounded, and returns true.
 */
bool kvp_nng_close_bounded(nng_socket s, int grace_ms, void (*then)(void *), void *arg);

#endif
