/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvpoolctl's reporting, below its commands: errors as a line on stderr or
 * (--json) an object on stdout, exit codes, and the hex it prints. The
 * main program and the command files use it; it uses none of them.
 */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "clients/c/tools/kvpoolctl.h"
#include "proto/wire.h"

static const char *const exit_kind[] = {"ok", "refused", "usage", "unreachable", "local"};

/* One error, as a line on stderr or, with --json, one object on stdout. Returns code. */
int
fail(struct ctl *x, int code, int status, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	x->reported = code;
	if (x->json) {
		cJSON *o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "command", x->cmd_name ? x->cmd_name : "");
		cJSON_AddStringToObject(o, "status", kvp_status_wire_name(status));
		cJSON_AddStringToObject(o, "error", exit_kind[code]);
		cJSON_AddNumberToObject(o, "exit_code", code);
		cJSON_AddStringToObject(o, "detail", msg);
		char *s = cJSON_PrintUnformatted(o);
		if (s)
			printf("%s\n", s);
		free(s);
		cJSON_Delete(o);
	} else {
		fprintf(stderr, "kvpoolctl: %s\n", msg);
		if (code == EXIT_USAGE)
			fprintf(stderr, "kvpoolctl: see kvpoolctl --help\n");
	}
	return code;
}

/* The exit code of a status from the library or the daemon. */
int
exit_of(int status)
{
	return status == KVP_OK ? EXIT_OK : status == KVP_EUNAVAILABLE ? EXIT_UNREACHABLE : EXIT_REFUSED;
}

/* A failed call: the daemon's (or library's) status and detail. */
int
refused(struct ctl *x, int status, const char *detail)
{
	return fail(x, exit_of(status), status, "%s: %s%s%s", kvp_status_wire_name(status),
	            kvp_strerror(status), detail && detail[0] ? ": " : "", detail ? detail : "");
}

void
ctl_hex_into(char *dst, const uint8_t *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		snprintf(dst + 2 * i, 3, "%02x", b[i]);
	dst[2 * n] = '\0';
}
