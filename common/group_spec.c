/* SPDX-License-Identifier: Apache-2.0 */
#include "common/group_spec.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/events.h"
#include "common/kvp_status.h"

static const struct {
	const char *shortname, *longname;
} kinds[] = {
#define KVP_X_(id, s, l) [KVP_GROUP_##id] = {s, l},
	KVP_GROUP_KINDS(KVP_X_)
#undef KVP_X_
};

static const char *const mamba_modes[] = {
	[KVP_MAMBA_AUTO] = "auto", [KVP_MAMBA_ALIGN] = "align",
	[KVP_MAMBA_ALL] = "all", [KVP_MAMBA_NONE] = "none",
};

const char *
kvp_group_kind_name(enum kvp_group_kind k)
{
	return (unsigned)k < KVP_GROUP_NUM_KINDS ? kinds[k].longname : "unknown";
}

const char *
kvp_group_kind_short(enum kvp_group_kind k)
{
	return (unsigned)k < KVP_GROUP_NUM_KINDS ? kinds[k].shortname : "unknown";
}

int
kvp_group_kind_parse(const char *s, enum kvp_group_kind *out)
{
	if (s == NULL || out == NULL)
		return KVP_EINVAL;
	for (int k = 0; k < KVP_GROUP_NUM_KINDS; k++) {
		if (strcmp(s, kinds[k].shortname) == 0 || strcmp(s, kinds[k].longname) == 0) {
			*out = (enum kvp_group_kind)k;
			return KVP_OK;
		}
	}
	return KVP_EINVAL;
}

const char *
kvp_mamba_mode_name(enum kvp_mamba_mode m)
{
	return (unsigned)m <= KVP_MAMBA_NONE ? mamba_modes[m] : "unknown";
}

int
kvp_mamba_mode_parse(const char *s, enum kvp_mamba_mode *out)
{
	for (int m = KVP_MAMBA_ALIGN; s != NULL && out != NULL && m <= KVP_MAMBA_NONE; m++)
		if (strcmp(s, mamba_modes[m]) == 0) {
			*out = (enum kvp_mamba_mode)m;
			return KVP_OK;
		}
	return KVP_EINVAL;
}

bool
kvp_group_spec_equal(const struct kvp_group_spec *a, const struct kvp_group_spec *b)
{
	return a->kind == b->kind && a->block_size == b->block_size && a->window == b->window &&
	       a->mamba_mode == b->mamba_mode;
}

static int
fail(char *err, size_t err_len, const char *fmt, ...)
{
	va_list ap;

	if (err != NULL && err_len > 0) {
		va_start(ap, fmt);
		vsnprintf(err, err_len, fmt, ap);
		va_end(ap);
	}
	return KVP_EINVAL;
}

static int
parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
	char *end;
	unsigned long long v;

	if (s == NULL || *s < '0' || *s > '9')
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno != 0 || *end != '\0' || v < lo || v > hi)
		return -1;
	*out = (uint32_t)v;
	return 0;
}

/* One item "kind:bs[:param]" (already split out, at most 127 bytes). */
static int
parse_item(char *item, struct kvp_group_spec *g, char *err, size_t err_len)
{
	char *field[4] = {0};
	size_t nf = 0;

	for (char *s = item; nf < 4; nf++) {
		field[nf] = s;
		if ((s = strchr(s, ':')) == NULL) {
			nf++;
			break;
		}
		*s++ = '\0';
	}
	memset(g, 0, sizeof(*g));
	if (kvp_group_kind_parse(field[0], &g->kind) != KVP_OK)
		return fail(err, err_len, "unknown group kind '%s' (full, sliding_window, "
		                          "chunked_local, mamba, cross_attention)", field[0]);
	if (nf < 2 || parse_u32(field[1], 1, 1u << 16, &g->block_size) != 0)
		return fail(err, err_len, "group '%s': a block size 1..65536 must follow the kind",
		            field[0]);
	switch (g->kind) {
	case KVP_GROUP_FULL:
	case KVP_GROUP_CROSS_ATTENTION:
		if (nf != 2)
			return fail(err, err_len, "group %s: takes only a block size (%s:16)", field[0],
			            field[0]);
		return KVP_OK;
	case KVP_GROUP_SLIDING_WINDOW:
	case KVP_GROUP_CHUNKED_LOCAL:
		if (nf != 3 || parse_u32(field[2], 1, 1u << 30, &g->window) != 0)
			return fail(err, err_len, "group %s: needs a %s of 1..2^30 tokens (%s:16:%s)",
			            field[0], g->kind == KVP_GROUP_SLIDING_WINDOW ? "window" : "chunk size",
			            field[0], g->kind == KVP_GROUP_SLIDING_WINDOW ? "128" : "8192");
		return KVP_OK;
	case KVP_GROUP_MAMBA:
		if (nf == 2)
			return KVP_OK;
		if (nf == 3 && kvp_mamba_mode_parse(field[2], &g->mamba_mode) == KVP_OK)
			return KVP_OK;
		return fail(err, err_len, "group mamba: takes a block size and optionally a cache "
		                          "mode align, all or none (mamba:16:align)");
	default:
		return fail(err, err_len, "unknown group kind");
	}
}

int
kvp_group_specs_parse(const char *text, struct kvp_group_spec *out, size_t cap, size_t *n,
                      char *err, size_t err_len)
{
	struct kvp_group_spec tmp[KVP_MAX_GROUPS];
	char item[128];
	size_t count = 0;
	int rv;

	if (text == NULL || out == NULL || n == NULL)
		return fail(err, err_len, "no groups");
	if (*text == '\0')
		return fail(err, err_len, "no groups: give at least one (full:16)");
	for (const char *s = text;;) {
		const char *e = strchr(s, '+');
		size_t len = e ? (size_t)(e - s) : strlen(s);
		if (count == cap || count == KVP_MAX_GROUPS)
			return fail(err, err_len, "more than %zu groups", cap < KVP_MAX_GROUPS ? cap :
			            (size_t)KVP_MAX_GROUPS);
		if (len == 0 || len >= sizeof(item))
			return fail(err, err_len, "group %zu is %s", count, len ? "too long" : "empty");
		memcpy(item, s, len);
		item[len] = '\0';
		if ((rv = parse_item(item, &tmp[count], err, err_len)) != KVP_OK)
			return rv;
		count++;
		if (e == NULL)
			break;
		s = e + 1;
	}
	memcpy(out, tmp, count * sizeof(*tmp));
	*n = count;
	return KVP_OK;
}

int
kvp_group_specs_format(const struct kvp_group_spec *groups, size_t n, char *buf, size_t cap)
{
	size_t used = 0;

	if (buf == NULL || cap == 0 || (groups == NULL && n > 0))
		return KVP_EINVAL;
	buf[0] = '\0';
	for (size_t i = 0; i < n; i++) {
		const struct kvp_group_spec *g = &groups[i];
		int w;
		if (g->kind == KVP_GROUP_SLIDING_WINDOW || g->kind == KVP_GROUP_CHUNKED_LOCAL)
			w = snprintf(buf + used, cap - used, "%s%s:%u:%u", i ? "+" : "",
			             kvp_group_kind_short(g->kind), g->block_size, g->window);
		else if (g->kind == KVP_GROUP_MAMBA && g->mamba_mode != KVP_MAMBA_AUTO)
			w = snprintf(buf + used, cap - used, "%smamba:%u:%s", i ? "+" : "",
			             g->block_size, kvp_mamba_mode_name(g->mamba_mode));
		else
			w = snprintf(buf + used, cap - used, "%s%s:%u", i ? "+" : "",
			             kvp_group_kind_short(g->kind), g->block_size);
		if (w < 0 || (size_t)w >= cap - used) {
			buf[0] = '\0';
			return KVP_EINVAL;
		}
		used += (size_t)w;
	}
	return KVP_OK;
}

static uint64_t
gcd64(uint64_t a, uint64_t b)
{
	while (b) {
		uint64_t t = a % b;
		a = b;
		b = t;
	}
	return a;
}

uint32_t
kvp_group_specs_lcm(const struct kvp_group_spec *groups, size_t n)
{
	uint64_t lcm = 1;

	if (groups == NULL || n == 0)
		return 0;
	for (size_t i = 0; i < n; i++) {
		if (groups[i].block_size == 0)
			return 0;
		lcm = lcm / gcd64(lcm, groups[i].block_size) * groups[i].block_size;
		if (lcm > UINT32_MAX)
			return 0;
	}
	return (uint32_t)lcm;
}

uint32_t
kvp_group_specs_hash_block_size(const struct kvp_group_spec *groups, size_t n)
{
	uint64_t g = 0;

	for (size_t i = 0; groups != NULL && i < n; i++)
		g = gcd64(g, groups[i].block_size);
	return (uint32_t)g;
}

void
kvp_group_specs_resolve(struct kvp_group_spec *groups, size_t n, bool enable_caching)
{
	for (size_t i = 0; groups != NULL && i < n; i++)
		if (groups[i].kind == KVP_GROUP_MAMBA && groups[i].mamba_mode == KVP_MAMBA_AUTO)
			groups[i].mamba_mode = enable_caching ? KVP_MAMBA_ALIGN : KVP_MAMBA_NONE;
}

int
kvp_group_specs_validate(const struct kvp_group_spec *groups, size_t n, uint32_t hash_block_size,
                         bool enable_caching, char *err, size_t err_len)
{
	uint32_t lcm;

	if (groups == NULL || n == 0 || n > KVP_MAX_GROUPS)
		return fail(err, err_len, "a pool has 1 to %d groups, not %zu", KVP_MAX_GROUPS, n);
	if (hash_block_size == 0)
		return fail(err, err_len, "hash_block_size must be at least 1");
	if ((lcm = kvp_group_specs_lcm(groups, n)) == 0)
		return fail(err, err_len, "the LCM of the group block sizes exceeds 2^32");
	for (size_t i = 0; i < n; i++) {
		const struct kvp_group_spec *g = &groups[i];
		bool windowed = g->kind == KVP_GROUP_SLIDING_WINDOW || g->kind == KVP_GROUP_CHUNKED_LOCAL;
		if ((unsigned)g->kind >= KVP_GROUP_NUM_KINDS)
			return fail(err, err_len, "group %zu: unknown kind", i);
		if (g->block_size == 0 || g->block_size > (1u << 16))
			return fail(err, err_len, "group %zu: block size %u is not in 1..65536", i,
			            g->block_size);
		if (windowed && (g->window == 0 || g->window > (1u << 30)))
			return fail(err, err_len, "group %zu (%s): the %s must be 1..2^30 tokens, not %u",
			            i, kvp_group_kind_name(g->kind),
			            g->kind == KVP_GROUP_SLIDING_WINDOW ? "window" : "chunk size", g->window);
		if (!windowed && g->window != 0)
			return fail(err, err_len, "group %zu (%s) has no window", i,
			            kvp_group_kind_name(g->kind));
		if (g->kind != KVP_GROUP_MAMBA && g->mamba_mode != KVP_MAMBA_AUTO)
			return fail(err, err_len, "group %zu (%s) has no Mamba cache mode", i,
			            kvp_group_kind_name(g->kind));
		if ((unsigned)g->mamba_mode > KVP_MAMBA_NONE)
			return fail(err, err_len, "group %zu: unknown Mamba cache mode", i);
		if (g->kind == KVP_GROUP_CROSS_ATTENTION && enable_caching)
			return fail(err, err_len, "group %zu (cross_attention): vLLM turns prefix caching "
			            "off for encoder-decoder models; the pool needs caching=off", i);
		if (!enable_caching)
			continue;
		if (g->block_size % hash_block_size != 0)
			return fail(err, err_len, "group %zu: block size %u is not a multiple of the "
			            "hash block size %u", i, g->block_size, hash_block_size);
		if (g->kind == KVP_GROUP_CHUNKED_LOCAL && g->block_size != lcm)
			return fail(err, err_len, "group %zu (chunked_local_attention): with prefix "
			            "caching its block size must be the LCM of all block sizes (%u), as "
			            "vLLM requires", i, lcm);
	}
	return KVP_OK;
}

void
kvp_group_specs_annotate(const struct kvp_group_spec *groups, size_t n, struct kvp_event_batch *b)
{
	for (size_t i = 0; i < kvp_event_batch_count(b); i++) {
		struct kvp_event ev;
		(void)kvp_event_batch_get(b, i, &ev);
		if (ev.type != KVP_EVENT_BLOCK_STORED || !ev.has_group_idx || ev.group_idx >= n)
			continue;
		const struct kvp_group_spec *s = &groups[ev.group_idx];
		bool sw = s->kind == KVP_GROUP_SLIDING_WINDOW;
		(void)kvp_event_batch_set_spec(b, i, kvp_group_kind_name(s->kind), sw,
		                               sw ? (int64_t)s->window : 0);
	}
}
