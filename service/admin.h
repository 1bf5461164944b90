/* SPDX-License-Identifier: Apache-2.0 */
/*
 * admin.h: kvpoold's HTTP admin endpoint (nng's HTTP server), on its own
 * port: GET /healthz (200 while the process serves), /readyz (200 once the
 * pools exist and the RPC endpoints listen, 503 while starting or
 * draining), /metrics (Prometheus text format).
 *
 * Owns nng's HTTP server threads. Open and close from one thread.
 */
#ifndef KVPD_ADMIN_H
#define KVPD_ADMIN_H

#include <stdatomic.h>
#include <stddef.h>

#include "service/server.h"

struct kvpd_admin;

/* Serves url (http://host:port). *ready is read on each /readyz. */
int kvpd_admin_open(struct kvpd_server *srv, const char *url, const atomic_bool *ready,
                    struct kvpd_admin **out, char *err, size_t err_len);
/* Stops serving. NULL: no-op. */
void kvpd_admin_close(struct kvpd_admin *a);

#endif /* KVPD_ADMIN_H */
