/* SPDX-License-Identifier: Apache-2.0 */
/* tls_config.c: the daemon's TLS server configuration, for the transport and --check-config. */
#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>
#include <stdio.h>
#include <stdlib.h>

#include "proto/wire.h"
#include "service/config/config_impl.h"

int
kvpd_tls_server_config(const struct kvpd_config *cfg, nng_tls_config **out, char *err, size_t len)
{
	char *cert = kvp_wire_read_file(cfg->tls_cert), *key = kvp_wire_read_file(cfg->tls_key);
	nng_tls_config *t = NULL;
	int rv = -1;

	if (cert == NULL || key == NULL) {
		snprintf(err, len, "cannot read tls-cert %s or tls-key %s", cfg->tls_cert, cfg->tls_key);
		goto out;
	}
	if ((rv = nng_tls_config_alloc(&t, NNG_TLS_MODE_SERVER)) != 0 ||
	    (rv = nng_tls_config_own_cert(t, cert, key, NULL)) != 0) {
		snprintf(err, len, "TLS certificate %s with key %s: %s (not PEM, or the key is not "
		         "the certificate's)", cfg->tls_cert, cfg->tls_key, nng_strerror(rv));
		rv = -1;
		goto out;
	}
	if (cfg->tls_ca[0] != '\0') {
		if ((rv = nng_tls_config_ca_file(t, cfg->tls_ca)) != 0 ||
		    (rv = nng_tls_config_auth_mode(t, NNG_TLS_AUTH_MODE_REQUIRED)) != 0) {
			snprintf(err, len, "TLS client CA %s: %s", cfg->tls_ca, nng_strerror(rv));
			rv = -1;
			goto out;
		}
	} else {
		(void)nng_tls_config_auth_mode(t, NNG_TLS_AUTH_MODE_NONE);
	}
	*out = t;
	t = NULL;
	rv = 0;
out:
	if (t != NULL)
		nng_tls_config_free(t);
	free(cert);
	free(key);
	return rv;
}
