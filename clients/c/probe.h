/* SPDX-License-Identifier: Apache-2.0 */
/*
 * probe.h (internal, not exported): whether anything listens at a URL, by
 * one plain connect() (no nng, no handshake). A client whose nng dial made
 * no connection uses it to tell "nobody listens" from "something listens
 * but completes no connection" (a daemon at its open-files limit, or one
 * too busy to accept), which deserve different advice.
 */
#ifndef KVP_CLIENT_PROBE_H
#define KVP_CLIENT_PROBE_H

/*
 * For ipc://PATH and [tls+]tcp[4|6]://HOST:PORT: 1 if a connect succeeds
 * within timeout_ms, 0 if it is refused or the path is not there, 2 if the
 * host does not resolve, -1 for any other URL or failure to tell.
 */
int kvpc_listen_probe(const char *url, int timeout_ms);

#endif /* KVP_CLIENT_PROBE_H */
