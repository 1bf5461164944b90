/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tls.h (internal, not exported): the client side of tls+tcp:// for the RPC client and the event
 * subscriber. Verification is the default: the CA given, else the
 * system's bundle; only an explicit insecure flag (tests) skips it. An IP
 * address URL needs a server name, since mbed TLS checks DNS names only.
 */
#ifndef KVP_CLIENT_TLS_H
#define KVP_CLIENT_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>

struct kvp_tls_options {
	const char *ca_file, *cert_file, *key_file, *server_name;
	bool insecure;
};

/* The system CA bundles looked for, in order, when no CA file is given. */
extern const char *const kvpc_tls_system_bundles[];

/*
 * A client TLS configuration for url (tls+tcp://HOST:PORT) into *out.
 * KVP_OK, or KVP_EINVAL / KVP_EINTERNAL with the reason in err (nothing
 * allocated).
 */
int kvpc_tls_client_config(const char *url, const struct kvp_tls_options *o,
                          nng_tls_config **out, char *err, size_t len);

/*
 * Why a tls+tcp:// dial does not connect: one synchronous dial with cfg.
 * 0 if it connects now, else nng's error (NNG_ECONNREFUSED: nobody
 * listens; NNG_ECRYPTO / NNG_EPEERAUTH: the handshake failed).
 */
int kvpc_tls_probe(const char *url, nng_tls_config *cfg);

#endif /* KVP_CLIENT_TLS_H */
