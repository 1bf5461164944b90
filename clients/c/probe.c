/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L
#include "clients/c/probe.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* Connects fd to addr within timeout_ms: 1 connected, 0 refused, -1 unknown. */
static int
try_connect(int fd, const struct sockaddr *addr, socklen_t len, int timeout_ms)
{
	int flags = fcntl(fd, F_GETFL, 0), err = 0;
	socklen_t el = sizeof(err);
	if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
		return -1;
	if (connect(fd, addr, len) == 0)
		return 1;
	if (errno == ECONNREFUSED || errno == ENOENT)
		return 0;
	if (errno != EINPROGRESS && errno != EAGAIN)
		return -1;
	struct pollfd p = {.fd = fd, .events = POLLOUT};
	if (poll(&p, 1, timeout_ms) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0)
		return -1;
	return err == 0 ? 1 : err == ECONNREFUSED ? 0 : -1;
}

static int
probe_ipc(const char *path, int timeout_ms)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof(a.sun_path))
		return -1;
	memcpy(a.sun_path, path, strlen(path) + 1);
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	if (fd < 0)
		return -1;
	int rv = try_connect(fd, (struct sockaddr *)&a, sizeof(a), timeout_ms);
	close(fd);
	return rv;
}

static int
probe_tcp(const char *hostport, int timeout_ms)
{
	char host[256];
	const char *port = strrchr(hostport, ':');
	size_t hl = port ? (size_t)(port - hostport) : 0;
	if (port == NULL || hl == 0 || hl >= sizeof(host))
		return -1;
	if (hostport[0] == '[' && hostport[hl - 1] == ']') { /* [v6 address] */
		hostport++;
		hl -= 2;
	}
	memcpy(host, hostport, hl);
	host[hl] = '\0';
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
	if (getaddrinfo(host, port + 1, &hints, &res) != 0)
		return 2; /* no such host */
	int rv = -1;
	for (struct addrinfo *ai = res; ai != NULL && rv != 1; ai = ai->ai_next) {
		int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
		if (fd < 0)
			continue;
		int r = try_connect(fd, ai->ai_addr, ai->ai_addrlen, timeout_ms);
		close(fd);
		rv = r > rv ? r : rv;
	}
	freeaddrinfo(res);
	return rv;
}

int
kvpc_listen_probe(const char *url, int timeout_ms)
{
	static const char *const tcp[] = {"tcp://", "tcp4://", "tcp6://", "tls+tcp://",
	                                  "tls+tcp4://", "tls+tcp6://"};
	if (url == NULL)
		return -1;
	if (strncmp(url, "ipc://", 6) == 0)
		return probe_ipc(url + 6, timeout_ms);
	for (size_t i = 0; i < sizeof(tcp) / sizeof(tcp[0]); i++)
		if (strncmp(url, tcp[i], strlen(tcp[i])) == 0)
			return probe_tcp(url + strlen(tcp[i]), timeout_ms);
	return -1;
}
