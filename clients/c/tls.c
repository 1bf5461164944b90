/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L
#include "clients/c/tls.h"

#include <arpa/inet.h>
#include <nng/protocol/reqrep0/req.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/kvp_status.h"
#include "proto/wire.h"

const char *const kvpc_tls_system_bundles[] = {
	"/etc/ssl/certs/ca-certificates.crt", /* Debian, Ubuntu */
	"/etc/pki/tls/certs/ca-bundle.crt",   /* Fedora, RHEL */
	"/etc/ssl/cert.pem",                  /* Alpine, macOS */
	NULL,
};

/* Whether url's host is an IPv4 or IPv6 literal. */
static bool
host_is_ip(const char *url)
{
	const char *h = strstr(url, "://");
	char host[64];
	size_t n;
	unsigned char addr[16];

	if (h == NULL)
		return false;
	h += 3;
	if (*h == '[') /* [v6]:port */
		return true;
	n = strcspn(h, ":/");
	if (n == 0 || n >= sizeof(host))
		return false;
	memcpy(host, h, n);
	host[n] = '\0';
	return inet_pton(AF_INET, host, addr) == 1;
}

const char *
kvpc_tls_ca_path(const struct kvp_tls_options *o)
{
	const char *ca = o->ca_file;
	for (size_t i = 0; kvpc_tls_system_bundles[i] != NULL && ca == NULL; i++)
		if (access(kvpc_tls_system_bundles[i], R_OK) == 0)
			ca = kvpc_tls_system_bundles[i];
	return ca;
}

int
kvpc_tls_client_config(const char *url, const struct kvp_tls_options *o, nng_tls_config **out,
                      char *err, size_t len)
{
	nng_tls_config *cfg = NULL;
	const char *ca = o->ca_file;
	int rv;

	if (!o->insecure && ca == NULL) {
		ca = kvpc_tls_ca_path(o);
		if (ca == NULL) {
			snprintf(err, len, "TLS: no CA file given and no system CA bundle (%s): give the "
			         "CA that signed the daemon's certificate", kvpc_tls_system_bundles[0]);
			return KVP_EINVAL;
		}
	}
	if (!o->insecure && o->server_name == NULL && host_is_ip(url)) {
		snprintf(err, len, "TLS to an IP address: its name cannot be checked (mbed TLS checks "
		         "DNS names only); give the server name in the daemon's certificate");
		return KVP_EINVAL;
	}
	if ((rv = nng_tls_config_alloc(&cfg, NNG_TLS_MODE_CLIENT)) != 0) {
		snprintf(err, len, "TLS: %s", nng_strerror(rv));
		return KVP_EINTERNAL;
	}
	if (o->insecure) {
		rv = nng_tls_config_auth_mode(cfg, NNG_TLS_AUTH_MODE_NONE);
	} else if ((rv = nng_tls_config_ca_file(cfg, ca)) != 0) {
		snprintf(err, len, "TLS CA file %s: %s", ca, nng_strerror(rv));
		goto fail;
	} else {
		rv = nng_tls_config_auth_mode(cfg, NNG_TLS_AUTH_MODE_REQUIRED);
	}
	if (rv != 0 ||
	    (o->server_name != NULL && (rv = nng_tls_config_server_name(cfg, o->server_name)) != 0)) {
		snprintf(err, len, "TLS settings: %s", nng_strerror(rv));
		goto fail;
	}
	if (o->cert_file != NULL) {
		char *cert = kvp_wire_read_file(o->cert_file);
		char *key = o->key_file ? kvp_wire_read_file(o->key_file) : NULL;
		rv = cert && key ? nng_tls_config_own_cert(cfg, cert, key, NULL) : NNG_ENOENT;
		free(cert);
		free(key);
		if (rv != 0) {
			snprintf(err, len, "TLS client certificate %s: %s", o->cert_file, nng_strerror(rv));
			goto fail;
		}
	}
	*out = cfg;
	return KVP_OK;
fail:
	nng_tls_config_free(cfg);
	return KVP_EINVAL;
}

int
kvpc_tls_probe(const char *url, nng_tls_config *cfg)
{
	nng_socket s;
	nng_dialer d;
	int rv;
	if ((rv = nng_req0_open(&s)) != 0)
		return rv;
	if ((rv = nng_dialer_create(&d, s, url)) == 0 &&
	    (rv = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, cfg)) == 0)
		rv = nng_dialer_start(d, 0);
	nng_close(s);
	return rv;
}
