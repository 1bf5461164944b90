/* SPDX-License-Identifier: Apache-2.0 */
/*
 * transport.h: kvpoold's sockets: one nng REP socket listening on every
 * configured RPC endpoint (ipc://, tcp://, tls+tcp://), with several
 * contexts so that many clients are served at once (each receives a request,
 * hands it to kvpd_server_handle() and sends the reply), and the PUB socket
 * the pools' event batches go out on.
 *
 * Owns threads (nng's) and sockets. Start and stop from one thread.
 */
#ifndef KVPD_TRANSPORT_H
#define KVPD_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "service/config/config.h"
#include "service/pool/server.h"

struct kvpd_transport;

/* Opens the socket and its listeners. KVP_OK, or a status with err_buf saying why. */
int kvpd_transport_open(struct kvpd_server *srv, const struct kvpd_config *cfg,
                        struct kvpd_transport **out, char *err_buf, size_t err_len);

/*
 * Stops accepting connections, waits up to drain_ms for calls in flight to
 * finish, then closes everything. NULL: no-op. Returns within about
 * drain_ms + 2 s even when nng's own close hangs (see transport.c).
 */
void kvpd_transport_close(struct kvpd_transport *t, uint32_t drain_ms);

/*
 * The publisher kvpd_transport_open installs when `events` is set: sends one
 * batch on the PUB socket, never blocking (a full queue drops; seq shows it).
 */
void kvpd_transport_publish(void *ctx, const char *pool, const uint8_t *batch, size_t len);

/* Calls served so far (replies sent). */
uint64_t kvpd_transport_served(const struct kvpd_transport *t);

#endif /* KVPD_TRANSPORT_H */
