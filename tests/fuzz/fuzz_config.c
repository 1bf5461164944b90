/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: arbitrary bytes into kvpoold's configuration loader,
 * the way an operator's mistakes reach it. The first byte picks the door:
 *   0: a config file's contents (--config FILE),
 *   1: the KVPOOL_POOL environment variable (pool specs joined by ';'),
 *   2: command-line arguments (the rest split at NUL bytes),
 *   3: --check-config over a config file (every problem reported).
 * The loader must return 0, 1 or -1 and never crash, hang, leak or write
 * out of bounds; its messages go to /dev/null.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "service/config/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_ARGS = 64 };

static char path[64];
static FILE *sink;

static void
cleanup(void)
{
	unlink(path);
	if (sink)
		fclose(sink);
}

static int
write_file(const uint8_t *data, size_t size)
{
	FILE *f = fopen(path, "wb");
	if (f == NULL)
		return -1;
	size_t n = fwrite(data, 1, size, f);
	return fclose(f) == 0 && n == size ? 0 : -1;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct kvpd_config c; /* large: not on the stack */
	char *argv[MAX_ARGS + 4] = {"kvpoold"}, *envp[2] = {NULL, NULL};
	char *copy = NULL;
	int argc = 1, rv;

	if (size < 1)
		return 0;
	if (path[0] == '\0') {
		snprintf(path, sizeof(path), "/tmp/kvp-fuzz-config-%d", (int)getpid());
		sink = fopen("/dev/null", "w");
		atexit(cleanup);
	}
	uint8_t door = data[0] % 4;
	data++;
	size--;
	/* A NUL-terminated copy of the rest. */
	if ((copy = malloc(size + 32)) == NULL)
		return 0;
	memcpy(copy + 12, data, size);
	copy[12 + size] = '\0';
	switch (door) {
	case 0:
	case 3:
		if (write_file(data, size) != 0)
			goto out;
		argv[argc++] = "--config";
		argv[argc++] = path;
		if (door == 3)
			argv[argc++] = "--check-config";
		break;
	case 1:
		memcpy(copy, "KVPOOL_POOL=", 12);
		envp[0] = copy;
		break;
	default:
		for (size_t i = 0; i < size && argc < MAX_ARGS;) {
			argv[argc++] = copy + 12 + i;
			i += strlen(copy + 12 + i) + 1;
		}
		break;
	}
	memset(&c, 0, sizeof(c));
	rv = kvpd_config_load(&c, argc, argv, envp, sink, sink);
	if (rv < -1 || rv > 1)
		abort(); /* the documented results only */
out:
	free(copy);
	return 0;
}
