/* SPDX-License-Identifier: Apache-2.0 */
#include "common/kvp_status.h"

#include <stddef.h>

#define KVP_STATUS_TEXT_(name, num, wire, text) [num] = text,
#define KVP_STATUS_NAME_(name, num, wire, text) [num] = #name,
#define KVP_STATUS_WIRE_(name, num, wire, text) [num] = wire,
static const char *const status_text[] = {KVP_STATUS_TABLE(KVP_STATUS_TEXT_)};
static const char *const status_name[] = {KVP_STATUS_TABLE(KVP_STATUS_NAME_)};
static const char *const status_wire[] = {KVP_STATUS_TABLE(KVP_STATUS_WIRE_)};
#undef KVP_STATUS_TEXT_
#undef KVP_STATUS_NAME_
#undef KVP_STATUS_WIRE_

_Static_assert(sizeof(status_text) / sizeof(status_text[0]) == KVP_STATUS_COUNT,
               "KVP_STATUS_COUNT must match the table");

const char *
kvp_strerror(int status)
{
	if (status < 0 || status >= KVP_STATUS_COUNT || status_text[status] == NULL)
		return "unknown status";
	return status_text[status];
}

const char *
kvp_status_name(int status)
{
	if (status < 0 || status >= KVP_STATUS_COUNT || status_name[status] == NULL)
		return "KVP_UNKNOWN";
	return status_name[status];
}

const char *
kvp_status_wire_name(int status)
{
	if (status < 0 || status >= KVP_STATUS_COUNT || status_wire[status] == NULL)
		return "UNKNOWN";
	return status_wire[status];
}
