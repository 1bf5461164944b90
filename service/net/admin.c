/* SPDX-License-Identifier: Apache-2.0 */
#define _GNU_SOURCE /* accept4, pipe2 */
#include "service/net/admin.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <nng/nng.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/kvp_status.h"
#include "service/log.h"

/* After the reply, how long a connection may take to send what it has left and close. */
#define LINGER_MS 1000
/* With every slot taken, a newcomer takes the slot of the oldest connection still
 * sending its request, if that one has had at least this long. */
#define EVICT_AFTER_MS 100

enum conn_state { FREE, READING, WRITING, LINGERING };

struct conn {
	enum conn_state state;
	int fd;
	uint64_t start_ms, deadline_ms;
	size_t in_len;
	char in[KVPD_ADMIN_MAX_REQUEST];
	char *out;                 /* the whole reply; malloc'd */
	size_t out_len, out_off;
};

struct kvpd_admin {
	struct kvpd_server *srv;
	const atomic_bool *ready;
	int lfd, wake[2];
	pthread_t thr;
	bool has_thr;
	uint64_t accept_after_ms;  /* out of descriptors: accept again at this time */
	struct conn conns[KVPD_ADMIN_MAX_CONNS];
};

static uint64_t
now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void
conn_close(struct conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	free(c->out);
	c->fd = -1;
	c->out = NULL;
	c->out_len = c->out_off = c->in_len = 0;
	c->state = FREE;
}

static const char *
reason(int code)
{
	switch (code) {
	case 200: return "OK";
	case 400: return "Bad Request";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 408: return "Request Timeout";
	case 431: return "Request Header Fields Too Large";
	case 500: return "Internal Server Error";
	case 503: return "Service Unavailable";
	default: return "Error";
	}
}

/* Builds the reply in c->out (body left out for HEAD) and starts writing it. */
static void
respond(struct conn *c, int code, const char *type, const char *body, size_t len, bool head)
{
	char hdr[256];
	int n = snprintf(hdr, sizeof(hdr),
	                 "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s"
	                 "Connection: close\r\n\r\n",
	                 code, reason(code), type, len, code == 405 ? "Allow: GET, HEAD\r\n" : "");
	size_t total = (size_t)n + (head ? 0 : len);

	free(c->out);
	if ((c->out = malloc(total)) == NULL) {
		conn_close(c); /* no memory for a reply: the peer sees the close */
		return;
	}
	memcpy(c->out, hdr, (size_t)n);
	if (!head)
		memcpy(c->out + n, body, len);
	c->out_len = total;
	c->out_off = 0;
	c->state = WRITING; /* one request per connection: the rest is never parsed */
}

static void
respond_text(struct conn *c, int code, const char *text)
{
	respond(c, code, "text/plain", text, strlen(text), false);
}

/* The request line and headers are in c->in (ending "\r\n\r\n"): route it. */
static void
handle(struct kvpd_admin *a, struct conn *c)
{
	char method[8], target[256], version[16];
	c->in[c->in_len] = '\0';
	/* METHOD SP TARGET SP HTTP/1.x CRLF; anything else is a 400. */
	if (sscanf(c->in, "%7[A-Z] %255[^ \r\n] %15[^\r\n]", method, target, version) != 3 ||
	    strncmp(version, "HTTP/1.", 7) != 0 || version[7] < '0' || version[7] > '9' ||
	    version[8] != '\0') {
		respond_text(c, 400, "bad request\n");
		return;
	}
	bool head = strcmp(method, "HEAD") == 0;
	target[strcspn(target, "?#")] = '\0';
	int route = strcmp(target, "/healthz") == 0   ? 1
	            : strcmp(target, "/readyz") == 0  ? 2
	            : strcmp(target, "/metrics") == 0 ? 3
	                                              : 0;
	if (route == 0) {
		respond_text(c, 404, "not found\n");
	} else if (!head && strcmp(method, "GET") != 0) {
		respond_text(c, 405, "method not allowed\n");
	} else if (route == 1) {
		respond(c, 200, "text/plain", "ok\n", 3, head);
	} else if (route == 2) {
		bool r = atomic_load(a->ready);
		respond(c, r ? 200 : 503, "text/plain", r ? "ready\n" : "not ready\n", r ? 6 : 10, head);
	} else {
		char *text = kvpd_metrics_render(a->srv);
		if (text == NULL) {
			respond_text(c, 500, "out of memory\n");
			return;
		}
		respond(c, 200, "text/plain; version=0.0.4", text, strlen(text), head);
		free(text);
	}
}

static void
on_readable(struct kvpd_admin *a, struct conn *c)
{
	if (c->state == LINGERING) {
		char sink[4096];
		ssize_t r = read(c->fd, sink, sizeof(sink));
		if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
			conn_close(c);
		return;
	}
	size_t room = sizeof(c->in) - 1 - c->in_len;
	ssize_t r = read(c->fd, c->in + c->in_len, room);
	if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
		conn_close(c); /* gone before a whole request */
		return;
	}
	if (r < 0)
		return;
	/* Only the new bytes (and the 3 before them) can complete the end of the headers. */
	size_t from = c->in_len > 3 ? c->in_len - 3 : 0;
	c->in_len += (size_t)r;
	c->in[c->in_len] = '\0';
	if (strstr(c->in + from, "\r\n\r\n") != NULL || strstr(c->in + from, "\n\n") != NULL)
		handle(a, c);
	else if (c->in_len == sizeof(c->in) - 1)
		respond_text(c, 431, "request headers too large\n");
}

static void
on_writable(struct conn *c)
{
	ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
	if (w < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (w < 0) {
		conn_close(c);
		return;
	}
	c->out_off += (size_t)w;
	if (c->out_off == c->out_len) {
		/* Close politely: our FIN first, then wait (briefly) for theirs. */
		shutdown(c->fd, SHUT_WR);
		c->state = LINGERING;
		uint64_t linger = now_ms() + LINGER_MS;
		if (linger < c->deadline_ms)
			c->deadline_ms = linger;
	}
}

static const char timeout_reply[] = "HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n"
                                    "Connection: close\r\n\r\n";

/* The connection still reading its request that came first, if it came EVICT_AFTER_MS ago. */
static struct conn *
oldest_reader(struct kvpd_admin *a, uint64_t now)
{
	struct conn *old = NULL;
	for (size_t i = 0; i < KVPD_ADMIN_MAX_CONNS; i++) {
		struct conn *c = &a->conns[i];
		if (c->state == READING && now - c->start_ms >= EVICT_AFTER_MS &&
		    (old == NULL || c->start_ms < old->start_ms))
			old = c;
	}
	return old;
}

static void
on_accept(struct kvpd_admin *a)
{
	for (int k = 0; k < 16; k++) { /* a bounded batch per wakeup */
		int fd = accept4(a->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			/* Out of descriptors: the backlog stays readable, so stop polling it a while. */
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
				a->accept_after_ms = now_ms() + 100;
			return;
		}
		struct conn *c = NULL;
		uint64_t now = now_ms();
		for (size_t i = 0; i < KVPD_ADMIN_MAX_CONNS && c == NULL; i++)
			if (a->conns[i].state == FREE)
				c = &a->conns[i];
		if (c == NULL && (c = oldest_reader(a, now)) != NULL) {
			/* Slow senders cannot hold every slot: the oldest gives its up. */
			if (c->in_len > 0)
				(void)!send(c->fd, timeout_reply, sizeof(timeout_reply) - 1,
				            MSG_NOSIGNAL | MSG_DONTWAIT);
			conn_close(c);
		}
		if (c == NULL) {
			static const char busy[] = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
			                           "Connection: close\r\n\r\n";
			(void)!send(fd, busy, sizeof(busy) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
			close(fd);
			continue;
		}
		c->fd = fd;
		c->state = READING;
		c->in_len = 0;
		c->start_ms = now;
		c->deadline_ms = now + KVPD_ADMIN_DEADLINE_MS;
		on_readable(a, c); /* a probe's request is often here already */
	}
}

static void *
serve(void *arg)
{
	struct kvpd_admin *a = arg;
	struct pollfd pf[KVPD_ADMIN_MAX_CONNS + 2];
	struct conn *of[KVPD_ADMIN_MAX_CONNS + 2];

	for (;;) {
		uint64_t now = now_ms(), next = now + 1000;
		nfds_t n = 0;
		pf[n++] = (struct pollfd){.fd = a->wake[0], .events = POLLIN};
		pf[n++] = (struct pollfd){.fd = now >= a->accept_after_ms ? a->lfd : -1,
		                          .events = POLLIN};
		if (now < a->accept_after_ms)
			next = a->accept_after_ms;
		for (size_t i = 0; i < KVPD_ADMIN_MAX_CONNS; i++) {
			struct conn *c = &a->conns[i];
			if (c->state == FREE)
				continue;
			if (now >= c->deadline_ms) {
				if (c->state == READING && c->in_len > 0)
					(void)!send(c->fd, timeout_reply, sizeof(timeout_reply) - 1,
					            MSG_NOSIGNAL | MSG_DONTWAIT);
				conn_close(c);
				continue;
			}
			if (c->deadline_ms < next)
				next = c->deadline_ms;
			of[n] = c;
			pf[n++] = (struct pollfd){.fd = c->fd,
			                          .events = c->state == WRITING ? POLLOUT : POLLIN};
		}
		if (poll(pf, n, (int)(next - now)) < 0 && errno != EINTR)
			return NULL;
		if (pf[0].revents != 0)
			return NULL; /* kvpd_admin_close */
		for (nfds_t i = 2; i < n; i++) {
			if (pf[i].revents == 0 || of[i]->state == FREE)
				continue;
			if (of[i]->state == WRITING)
				on_writable(of[i]);
			else
				on_readable(a, of[i]);
		}
		if (pf[1].revents != 0)
			on_accept(a);
	}
}

/* Binds host:port (the URL's) for listening. Returns the socket, or -1 with err set. */
static int
listen_on(const char *url, char *err, size_t len)
{
	nng_url *u = NULL;
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
	                         .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
	                *res = NULL;
	int fd = -1, rv, one = 1;

	if ((rv = nng_url_parse(&u, url)) != 0 || strcmp(u->u_scheme, "http") != 0 ||
	    u->u_port == NULL || u->u_port[0] == '\0') {
		snprintf(err, len, "admin endpoint %s: not http://HOST:PORT", url);
		nng_url_free(u);
		return -1;
	}
	const char *host = u->u_hostname[0] != '\0' ? u->u_hostname : NULL;
	if ((rv = getaddrinfo(host, u->u_port, &hints, &res)) != 0) {
		snprintf(err, len, "admin endpoint %s: %s", url, gai_strerror(rv));
		nng_url_free(u);
		return -1;
	}
	for (struct addrinfo *ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd < 0)
			continue;
		(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
			snprintf(err, len, "cannot serve %s: %s", url, strerror(errno));
			close(fd);
			fd = -1;
		}
	}
	if (fd < 0 && res == NULL)
		snprintf(err, len, "cannot serve %s: no address", url);
	freeaddrinfo(res);
	nng_url_free(u);
	return fd;
}

int
kvpd_admin_open(struct kvpd_server *srv, const char *url, const atomic_bool *ready,
                struct kvpd_admin **out, char *err, size_t len)
{
	struct kvpd_admin *a;

	if (srv == NULL || url == NULL || ready == NULL || out == NULL)
		return KVP_EINVAL;
	if ((a = calloc(1, sizeof(*a))) == NULL) {
		snprintf(err, len, "out of memory");
		return KVP_ENOMEM;
	}
	a->srv = srv;
	a->ready = ready;
	a->wake[0] = a->wake[1] = -1;
	for (size_t i = 0; i < KVPD_ADMIN_MAX_CONNS; i++)
		a->conns[i].fd = -1;
	if ((a->lfd = listen_on(url, err, len)) < 0) {
		kvpd_admin_close(a);
		return KVP_EINVAL;
	}
	if (pipe2(a->wake, O_CLOEXEC) != 0 || pthread_create(&a->thr, NULL, serve, a) != 0) {
		snprintf(err, len, "admin endpoint %s: out of resources", url);
		kvpd_admin_close(a);
		return KVP_EINTERNAL;
	}
	a->has_thr = true;
	*out = a;
	return KVP_OK;
}

void
kvpd_admin_close(struct kvpd_admin *a)
{
	if (a == NULL)
		return;
	if (a->has_thr) {
		(void)!write(a->wake[1], "x", 1);
		pthread_join(a->thr, NULL);
	}
	for (size_t i = 0; i < KVPD_ADMIN_MAX_CONNS; i++)
		if (a->conns[i].state != FREE)
			conn_close(&a->conns[i]);
	for (int k = 0; k < 2; k++)
		if (a->wake[k] >= 0)
			close(a->wake[k]);
	if (a->lfd >= 0)
		close(a->lfd);
	free(a);
}
