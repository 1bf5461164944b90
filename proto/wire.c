/* SPDX-License-Identifier: Apache-2.0 */
#include "proto/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The wire enum and the engine's enum are one table: check every number. */
#define SAME(wire, engine) _Static_assert((int)KVPOOL__V1__STATUS__##wire == engine, #wire)
SAME(STATUS_OK, KVP_OK);
SAME(STATUS_INVALID_ARGUMENT, KVP_EINVAL);
SAME(STATUS_NO_SPACE, KVP_ENOSPACE);
SAME(STATUS_NOT_FOUND, KVP_ENOTFOUND);
SAME(STATUS_WRONG_STATE, KVP_ESTATE);
SAME(STATUS_NOT_OWNER, KVP_ENOTOWNER);
SAME(STATUS_UNKNOWN_POOL, KVP_EUNKNOWNPOOL);
SAME(STATUS_UNSUPPORTED_VERSION, KVP_EVERSION);
SAME(STATUS_MESSAGE_TOO_LARGE, KVP_ETOOLARGE);
SAME(STATUS_UNAUTHENTICATED, KVP_EUNAUTH);
SAME(STATUS_BUSY, KVP_EBUSY);
SAME(STATUS_INTERNAL, KVP_EINTERNAL);
SAME(STATUS_OUT_OF_RANGE, KVP_ERANGE);
SAME(STATUS_NO_MEMORY, KVP_ENOMEM);
SAME(STATUS_NOT_SUPPORTED, KVP_ENOTSUP);
SAME(STATUS_NO_DEVICE, KVP_ENODEVICE);
SAME(STATUS_UNAVAILABLE, KVP_EUNAVAILABLE);
SAME(STATUS_DEADLINE_EXCEEDED, KVP_EDEADLINE);
SAME(STATUS_QUOTA_EXCEEDED, KVP_EQUOTA);
_Static_assert(KVP_STATUS_COUNT == 19, "a status was added: add it to kvpool.proto and here");
#undef SAME

int
kvp_wire_status(Kvpool__V1__Status s)
{
	int v = (int)s;
	return v >= 0 && v < KVP_STATUS_COUNT ? v : KVP_EINTERNAL;
}

int
kvp_wire_keys_from_proto(const Kvpool__V1__RequestKeys *k, struct kvp_request_keys *out,
                         struct kvp_mm_feature *mm, size_t cap, bool *has_lora_id,
                         int64_t *lora_id)
{
	memset(out, 0, sizeof(*out));
	*has_lora_id = false;
	*lora_id = 0;
	if (k == NULL)
		return KVP_OK;
	if (k->n_mm > cap)
		return KVP_EINVAL;
	out->lora_name = k->lora_name && k->lora_name[0] ? k->lora_name : NULL;
	out->lora_path = k->lora_path && k->lora_path[0] ? k->lora_path : NULL;
	out->cache_salt = k->cache_salt && k->cache_salt[0] ? k->cache_salt : NULL;
	out->session_id = k->session_id && k->session_id[0] ? k->session_id : NULL;
	for (size_t i = 0; i < k->n_mm; i++) {
		const Kvpool__V1__MmFeature *f = k->mm[i];
		if (f == NULL || f->identifier == NULL)
			return KVP_EINVAL;
		mm[i].identifier = f->identifier;
		mm[i].offset = f->offset;
		mm[i].length = f->length;
	}
	out->mm = k->n_mm ? mm : NULL;
	out->num_mm = k->n_mm;
	*has_lora_id = k->has_lora_id;
	*lora_id = k->lora_id;
	return kvp_request_keys_validate(out);
}

void
kvp_wire_keys_to_proto(const struct kvp_request_keys *k, bool has_lora_id, int64_t lora_id,
                       Kvpool__V1__RequestKeys *out, Kvpool__V1__MmFeature *mm_msgs,
                       Kvpool__V1__MmFeature **mm_ptrs)
{
	kvpool__v1__request_keys__init(out);
	out->has_lora_id = has_lora_id;
	out->lora_id = lora_id;
	if (k == NULL)
		return;
	if (k->lora_name)
		out->lora_name = (char *)k->lora_name;
	if (k->lora_path)
		out->lora_path = (char *)k->lora_path;
	if (k->cache_salt)
		out->cache_salt = (char *)k->cache_salt;
	if (k->session_id)
		out->session_id = (char *)k->session_id;
	for (size_t i = 0; i < k->num_mm; i++) {
		kvpool__v1__mm_feature__init(&mm_msgs[i]);
		mm_msgs[i].identifier = (char *)k->mm[i].identifier;
		mm_msgs[i].offset = k->mm[i].offset;
		mm_msgs[i].length = k->mm[i].length;
		mm_ptrs[i] = &mm_msgs[i];
	}
	out->mm = k->num_mm ? mm_ptrs : NULL;
	out->n_mm = k->num_mm;
}

char *
kvp_wire_read_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	long n;

	if (f == NULL)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && n <= (1 << 20) &&
	    fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) != NULL) {
		if (fread(buf, 1, (size_t)n, f) == (size_t)n) {
			buf[n] = '\0';
		} else {
			free(buf);
			buf = NULL;
		}
	}
	fclose(f);
	return buf;
}
