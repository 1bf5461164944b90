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

/* The CA file o verifies the daemon with: o's, else the first system bundle found; NULL if none. */
const char *kvpc_tls_ca_path(const struct kvp_tls_options *o);

/*
 * After a failed handshake: repeats it once with OpenSSL (same CA file ca,
 * certificate, key and server name) and writes why it fails into why
 * (certificate required, unknown CA on either side, name mismatch,
 * expiry). 1 if it found a reason, 0 if not (no connection, or OpenSSL
 * succeeds where nng did not). Blocks up to about two seconds.
 */
int kvpc_tls_diagnose(const char *url, const struct kvp_tls_options *o, const char *ca,
                      char *why, size_t len);

#endif /* KVP_CLIENT_TLS_H */
