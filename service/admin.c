/* SPDX-License-Identifier: Apache-2.0 */
#include "service/admin.h"

#include <nng/nng.h>
#include <nng/supplemental/http/http.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_status.h"

struct kvpd_admin {
	struct kvpd_server *srv;
	const atomic_bool *ready;
	nng_http_server *http;
	nng_url *url;
};

static void
respond(nng_aio *aio, uint16_t code, const char *type, const char *body, size_t len)
{
	nng_http_res *res;
	if (nng_http_res_alloc(&res) != 0) {
		nng_aio_finish(aio, NNG_ENOMEM);
		return;
	}
	if (nng_http_res_set_status(res, code) != 0 ||
	    nng_http_res_set_header(res, "Content-Type", type) != 0 ||
	    nng_http_res_copy_data(res, body, len) != 0) {
		nng_http_res_free(res);
		nng_aio_finish(aio, NNG_ENOMEM);
		return;
	}
	nng_aio_set_output(aio, 0, res);
	nng_aio_finish(aio, 0);
}

static struct kvpd_admin *
admin_of(nng_aio *aio)
{
	return nng_http_handler_get_data(nng_aio_get_input(aio, 1));
}

static void
on_healthz(nng_aio *aio)
{
	respond(aio, 200, "text/plain", "ok\n", 3);
}

static void
on_readyz(nng_aio *aio)
{
	struct kvpd_admin *a = admin_of(aio);
	if (atomic_load(a->ready))
		respond(aio, 200, "text/plain", "ready\n", 6);
	else
		respond(aio, 503, "text/plain", "not ready\n", 10);
}

static void
on_metrics(nng_aio *aio)
{
	struct kvpd_admin *a = admin_of(aio);
	char *text = kvpd_metrics_render(a->srv);
	if (text == NULL) {
		respond(aio, 500, "text/plain", "out of memory\n", 14);
		return;
	}
	respond(aio, 200, "text/plain; version=0.0.4", text, strlen(text));
	free(text);
}

int
kvpd_admin_open(struct kvpd_server *srv, const char *url, const atomic_bool *ready,
                struct kvpd_admin **out, char *err, size_t len)
{
	struct kvpd_admin *a = calloc(1, sizeof(*a));
	static const struct {
		const char *path;
		void (*cb)(nng_aio *);
	} routes[] = {{"/healthz", on_healthz}, {"/readyz", on_readyz}, {"/metrics", on_metrics}};
	int rv;

	if (a == NULL) {
		snprintf(err, len, "out of memory");
		return KVP_ENOMEM;
	}
	a->srv = srv;
	a->ready = ready;
	if ((rv = nng_url_parse(&a->url, url)) != 0 ||
	    (rv = nng_http_server_hold(&a->http, a->url)) != 0) {
		snprintf(err, len, "admin endpoint %s: %s", url, nng_strerror(rv));
		kvpd_admin_close(a);
		return KVP_EINVAL;
	}
	for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
		nng_http_handler *h;
		if ((rv = nng_http_handler_alloc(&h, routes[i].path, routes[i].cb)) != 0 ||
		    (rv = nng_http_handler_set_data(h, a, NULL)) != 0 ||
		    (rv = nng_http_server_add_handler(a->http, h)) != 0) {
			snprintf(err, len, "admin handler %s: %s", routes[i].path, nng_strerror(rv));
			kvpd_admin_close(a);
			return KVP_EINTERNAL;
		}
	}
	if ((rv = nng_http_server_start(a->http)) != 0) {
		snprintf(err, len, "cannot serve %s: %s", url, nng_strerror(rv));
		kvpd_admin_close(a);
		return KVP_EINTERNAL;
	}
	*out = a;
	return KVP_OK;
}

void
kvpd_admin_close(struct kvpd_admin *a)
{
	if (a == NULL)
		return;
	if (a->http) {
		nng_http_server_stop(a->http);
		nng_http_server_release(a->http);
	}
	if (a->url)
		nng_url_free(a->url);
	free(a);
}
