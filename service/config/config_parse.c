/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The value parsers every part of the configuration shares (config_impl.h):
 * beneath config.c, config_pool.c and config_vllm.c, so none of those needs
 * another for its values.
 */
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "service/config/config_impl.h"

int
kvpd_cfg_parse_u32(const char *v, uint32_t min, uint32_t max, uint32_t *out)
{
	char *end;
	unsigned long long x;

	if (v == NULL || !isdigit((unsigned char)v[0]))
		return -1;
	errno = 0;
	x = strtoull(v, &end, 10);
	if (errno != 0 || *end != '\0' || x < min || x > max)
		return -1;
	*out = (uint32_t)x;
	return 0;
}

int
kvpd_cfg_copy_str(char *dst, size_t cap, const char *v)
{
	if (v == NULL || strlen(v) >= cap)
		return -1;
	memcpy(dst, v, strlen(v) + 1);
	return 0;
}

int
kvpd_cfg_parse_bool(const char *v, bool *out)
{
	if (v == NULL)
		return -1;
	if (strcmp(v, "1") == 0 || strcmp(v, "true") == 0 || strcmp(v, "on") == 0)
		*out = true;
	else if (strcmp(v, "0") == 0 || strcmp(v, "false") == 0 || strcmp(v, "off") == 0)
		*out = false;
	else
		return -1;
	return 0;
}
