/* SPDX-License-Identifier: Apache-2.0 */
/*
 * admin.h: kvpoold's HTTP admin endpoint, on its own port: GET (or HEAD)
 * /healthz (200 while the process serves), /readyz (200 once the pools
 * exist and the RPC endpoints listen, 503 while starting or draining),
 * /metrics (Prometheus text format).
 *
 * A small HTTP/1.x server of our own on one thread (nng's HTTP server has
 * no timeouts: a peer that sent half a request held its connection, and a
 * file descriptor, forever). One request per connection, answered with
 * "Connection: close". What no peer can exceed:
 *   - KVPD_ADMIN_MAX_CONNS connections at once: a newcomer past that takes
 *     the slot of the oldest connection still sending its request (after
 *     100 ms; it gets 408), so slow senders cannot starve /healthz; only
 *     when every slot is replying or younger is it answered 503 and closed;
 *   - KVPD_ADMIN_MAX_REQUEST bytes of request line and headers (431);
 *   - KVPD_ADMIN_DEADLINE_MS from accept to the last byte of the reply:
 *     a connection still open then is closed (408 if nothing was sent).
 * A request body is never read. Open and close from one thread.
 */
#ifndef KVPD_ADMIN_H
#define KVPD_ADMIN_H

#include <stdatomic.h>
#include <stddef.h>

#include "service/pool/server.h"

#define KVPD_ADMIN_MAX_CONNS 64
#define KVPD_ADMIN_MAX_REQUEST 8192
#define KVPD_ADMIN_DEADLINE_MS 5000

struct kvpd_admin;

/* Serves url (http://host:port). *ready is read on each /readyz. */
int kvpd_admin_open(struct kvpd_server *srv, const char *url, const atomic_bool *ready,
                    struct kvpd_admin **out, char *err, size_t err_len);
/* Stops serving and closes every connection. NULL: no-op. */
void kvpd_admin_close(struct kvpd_admin *a);

#endif /* KVPD_ADMIN_H */
