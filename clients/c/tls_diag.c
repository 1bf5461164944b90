/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tls_diag.c: why a tls+tcp:// handshake failed, in words. nng reports
 * every failure as "Cryptographic error"; after one, the client repeats
 * the handshake once with OpenSSL, with the same CA, certificate, key and
 * server name, and reads the reason from its verification result or from
 * the daemon's alert: certificate required, unknown CA (either side),
 * name mismatch, expiry. Only on a failed open: never on the call path.
 */
#define _POSIX_C_SOURCE 200809L
#include "clients/c/tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

/* host and port of tls+tcp://HOST:PORT (HOST may be [v6]); false if malformed. */
static bool
split_url(const char *url, char *host, size_t hcap, char *port, size_t pcap)
{
	const char *h = strstr(url, "://"), *end, *colon;
	size_t n;

	if (h == NULL)
		return false;
	h += 3;
	if (*h == '[') {
		if ((end = strchr(h, ']')) == NULL || end[1] != ':')
			return false;
		h++;
		colon = end + 1;
	} else {
		if ((colon = strrchr(h, ':')) == NULL)
			return false;
		end = colon;
	}
	n = (size_t)(end - h);
	if (n == 0 || n >= hcap || strlen(colon + 1) == 0 || strlen(colon + 1) >= pcap)
		return false;
	memcpy(host, h, n);
	host[n] = '\0';
	snprintf(port, pcap, "%s", colon + 1);
	port[strcspn(port, "/")] = '\0';
	return true;
}

/* A connected TCP socket to host:port within ms, with ms send/receive timeouts; -1 if none. */
static int
dial(const char *host, const char *port, int ms)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai, *a;
	struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
	int fd = -1;

	if (getaddrinfo(host, port, &hints, &ai) != 0)
		return -1;
	for (a = ai; a != NULL && fd < 0; a = a->ai_next) {
		int s = socket(a->ai_family, a->ai_socktype, a->ai_protocol), err = 0;
		socklen_t el = sizeof(err);
		if (s < 0)
			continue;
		int fl = fcntl(s, F_GETFL);
		(void)fcntl(s, F_SETFL, fl | O_NONBLOCK);
		int rc = connect(s, a->ai_addr, a->ai_addrlen);
		if (rc != 0 && errno == EINPROGRESS) {
			struct pollfd p = {.fd = s, .events = POLLOUT};
			if (poll(&p, 1, ms) != 1 || getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &el) != 0)
				err = -1;
		} else if (rc != 0) {
			err = -1;
		}
		(void)fcntl(s, F_SETFL, fl);
		if (err == 0 && setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0 &&
		    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) == 0)
			fd = s;
		else
			close(s);
	}
	freeaddrinfo(ai);
	return fd;
}

/* The daemon's certificate failed our verification: v's reason. */
static void
say_verify(long v, const char *name, const char *ca, char *why, size_t len)
{
	switch (v) {
	case X509_V_ERR_HOSTNAME_MISMATCH:
		snprintf(why, len, "name mismatch: the daemon's certificate does not name %s (give "
		         "the server name it was issued for)", name);
		break;
	case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
	case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
	case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
	case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
	case X509_V_ERR_CERT_SIGNATURE_FAILURE:
		snprintf(why, len, "unknown CA: the daemon's certificate is not signed by a CA in %s",
		         ca);
		break;
	case X509_V_ERR_CERT_HAS_EXPIRED:
		snprintf(why, len, "the daemon's certificate has expired");
		break;
	case X509_V_ERR_CERT_NOT_YET_VALID:
		snprintf(why, len, "the daemon's certificate is not valid yet (check the clocks)");
		break;
	default:
		snprintf(why, len, "the daemon's certificate does not verify: %s",
		         X509_verify_cert_error_string(v));
	}
}

/* Called when the daemon asks for a client certificate and we have none: notes it. */
static int
asked_for_cert(SSL *s, X509 **x509, EVP_PKEY **pkey)
{
	(void)x509;
	(void)pkey;
	*(bool *)SSL_get_app_data(s) = true;
	return 0; /* none to give */
}

/* The daemon refused us: the reason its alert gives (mbed TLS closes without one). */
static void
say_alert(unsigned long e, bool have_cert, bool asked, char *why, size_t len)
{
	int r = ERR_GET_REASON(e);

	if (r == SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED || (!have_cert && asked) ||
	    (!have_cert && (r == SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE ||
	                    r == SSL_R_SSLV3_ALERT_BAD_CERTIFICATE ||
	                    r == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE)))
		snprintf(why, len, "certificate required: the daemon wants a client certificate "
		         "(give the certificate and key its CA signed)");
	else if (r == SSL_R_TLSV1_ALERT_UNKNOWN_CA)
		snprintf(why, len, "unknown CA: the daemon does not trust the CA that signed our "
		         "client certificate");
	else if (r == SSL_R_SSLV3_ALERT_BAD_CERTIFICATE ||
	         r == SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN ||
	         r == SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED)
		snprintf(why, len, "the daemon refused our client certificate (%s)",
		         ERR_reason_error_string(e));
	else
		snprintf(why, len, "%s", e ? ERR_reason_error_string(e) : "the connection closed");
}

int
kvpc_tls_diagnose(const char *url, const struct kvp_tls_options *o, const char *ca, char *why,
                  size_t len)
{
	char host[256], port[16];
	SSL_CTX *ctx = NULL;
	SSL *s = NULL;
	int fd, found = 0;
	bool asked = false;

	if (url == NULL || o == NULL || why == NULL || len == 0 ||
	    !split_url(url, host, sizeof(host), port, sizeof(port)) || (fd = dial(host, port, 1000)) < 0)
		return 0;
	const char *name = o->server_name ? o->server_name : host;
	ERR_clear_error();
	if ((ctx = SSL_CTX_new(TLS_client_method())) == NULL || (s = SSL_new(ctx)) == NULL)
		goto out;
	if (!o->insecure) {
		if (ca == NULL || SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1)
			goto out;
		SSL_set_verify(s, SSL_VERIFY_PEER, NULL);
		if (SSL_set1_host(s, name) != 1)
			goto out;
	}
	if (o->cert_file != NULL &&
	    (SSL_use_certificate_chain_file(s, o->cert_file) != 1 || o->key_file == NULL ||
	     SSL_use_PrivateKey_file(s, o->key_file, SSL_FILETYPE_PEM) != 1))
		goto out;
	SSL_CTX_set_client_cert_cb(ctx, asked_for_cert);
	SSL_set_app_data(s, &asked);
	if (SSL_set_fd(s, fd) != 1 || SSL_set_tlsext_host_name(s, name) != 1)
		goto out;
	ERR_clear_error();
	if (SSL_connect(s) == 1) {
		/* TLS 1.3 refuses a client certificate after the client's side is done. */
		char b;
		if (SSL_read(s, &b, 1) > 0 || ERR_peek_last_error() == 0)
			goto out; /* it works with OpenSSL: nothing to say */
	}
	long v = SSL_get_verify_result(s);
	if (v != X509_V_OK)
		say_verify(v, name, ca, why, len);
	else
		say_alert(ERR_peek_last_error(), o->cert_file != NULL, asked, why, len);
	found = 1;
out:
	ERR_clear_error();
	SSL_free(s);
	SSL_CTX_free(ctx);
	close(fd);
	return found;
}
