/* SPDX-License-Identifier: Apache-2.0 */
#include "common/pickle.h"

#include <stdbool.h>
#include <string.h>

#include "common/kvp_status.h"

/* CPython's Modules/_pickle.c framing constants (protocol 4 and up). */
#define FRAME_HDR 9          /* FRAME opcode + 8-byte little-endian length */
#define FRAME_TARGET 65536   /* a frame is committed once it reaches this */
#define FRAME_MIN 4          /* a shorter final frame is written without its header */
#define MAX_DEPTH 4          /* extra keys nest two deep; allow a margin */

enum {
	OP_PROTO = 0x80, OP_FRAME = 0x95, OP_STOP = '.', OP_MEMOIZE = 0x94,
	OP_BININT = 'J', OP_BININT1 = 'K', OP_BININT2 = 'M', OP_LONG1 = 0x8a,
	OP_NONE = 'N', OP_SHORT_BINBYTES = 'C', OP_BINBYTES = 'B',
	OP_SHORT_BINUNICODE = 0x8c, OP_BINUNICODE = 'X',
	OP_EMPTY_TUPLE = ')', OP_MARK = '(', OP_TUPLE = 't', OP_TUPLE1 = 0x85,
	OP_BINGET = 'h', OP_LONG_BINGET = 'j',
};

#define MAX_TAGS 8 /* distinct tags in one block: vLLM 0.33 has four */

/*
 * An output buffer with one open frame; bad is sticky (out of room). memo
 * counts the MEMOIZE opcodes written (the next memo index); tags remembers
 * where each tag string of this block was memoized.
 */
struct pk {
	uint8_t *b;
	size_t len, cap, frame;
	bool bad;
	bool tagged;
	uint32_t memo;
	size_t ntags;
	struct {
		const uint8_t *s;
		size_t n;
		uint32_t idx;
	} tags[MAX_TAGS];
};

static void
put(struct pk *w, const void *p, size_t n)
{
	if (w->bad || n > w->cap - w->len) {
		w->bad = true;
		return;
	}
	memcpy(w->b + w->len, p, n);
	w->len += n;
}

static void
put1(struct pk *w, uint8_t c)
{
	if (w->len < w->cap)
		w->b[w->len++] = c;
	else
		w->bad = true;
}

static void
put_le(struct pk *w, uint64_t v, size_t n)
{
	uint8_t t[8];
	for (size_t i = 0; i < n; i++)
		t[i] = (uint8_t)(v >> (8 * i));
	put(w, t, n);
}

static void
frame_open(struct pk *w)
{
	static const uint8_t zero[FRAME_HDR];
	w->frame = w->len;
	put(w, zero, FRAME_HDR);
}

static void
frame_commit(struct pk *w)
{
	size_t flen;

	if (w->bad)
		return;
	flen = w->len - w->frame - FRAME_HDR;
	if (flen >= FRAME_MIN) {
		w->b[w->frame] = OP_FRAME;
		for (int i = 0; i < 8; i++)
			w->b[w->frame + 1 + i] = (uint8_t)((uint64_t)flen >> (8 * i));
	} else {
		memmove(w->b + w->frame, w->b + w->frame + FRAME_HDR, flen);
		w->len -= FRAME_HDR;
	}
}

/*
 * Called as each object's save begins (pickle.py's save() calls
 * framer.commit_frame() first): a frame that has reached the target is
 * committed and a new one opened. So a tuple's closing opcodes stay in the
 * frame of its last item.
 */
static void
boundary(struct pk *w)
{
	if (!w->bad && w->len - w->frame - FRAME_HDR >= FRAME_TARGET) {
		frame_commit(w);
		frame_open(w);
	}
}

static void
begin(struct pk *w, uint8_t *buf, size_t cap)
{
	*w = (struct pk){.b = buf, .cap = cap};
	put1(w, OP_PROTO);
	put1(w, 5);
	frame_open(w);
}

static int
end(struct pk *w, size_t *len)
{
	put1(w, OP_STOP);
	frame_commit(w);
	if (w->bad)
		return KVP_EINVAL;
	*len = w->len;
	return KVP_OK;
}

/*
 * save_long: the smallest of BININT1, BININT2, BININT, else LONG1
 * (encode_long). Token ids come here by the thousand: one room check, then
 * plain stores.
 */
static void
pk_int(struct pk *w, int64_t v)
{
	uint8_t *p;

	boundary(w);
	if (w->bad || w->cap - w->len < 10) {
		w->bad = true;
		return;
	}
	p = w->b + w->len;
	if (v >= 0 && v <= INT32_MAX) {
		/* Without branches on the size: token sizes are random, mispredictions dear. */
		static const uint8_t op[3] = {OP_BININT1, OP_BININT2, OP_BININT};
		static const uint8_t len[3] = {2, 3, 5};
		uint32_t u = (uint32_t)v;
		unsigned cls = (u > 0xff) + (u > 0xffff);
		p[0] = op[cls];
		for (int i = 0; i < 4; i++)
			p[1 + i] = (uint8_t)(u >> (8 * i)); /* the unused bytes are overwritten */
		w->len += len[cls];
	} else if (v >= INT32_MIN && v <= INT32_MAX) {
		uint32_t u = (uint32_t)(int32_t)v;
		p[0] = OP_BININT;
		for (int i = 0; i < 4; i++)
			p[1 + i] = (uint8_t)(u >> (8 * i));
		w->len += 5;
	} else {
		uint64_t mag = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
		size_t bits = 64 - (size_t)__builtin_clzll(mag), n = bits / 8 + 1;
		uint8_t t[9];
		for (size_t i = 0; i < 8; i++)
			t[i] = (uint8_t)((uint64_t)v >> (8 * i));
		t[8] = v < 0 ? 0xff : 0;
		/* a negative number drops a redundant sign byte */
		if (v < 0 && n > 1 && t[n - 1] == 0xff && (t[n - 2] & 0x80))
			n--;
		p[0] = OP_LONG1;
		p[1] = (uint8_t)n;
		memcpy(p + 2, t, n);
		w->len += 2 + n;
	}
}

/*
 * str or bytes. Payloads of FRAME_TARGET or more are written outside frames
 * by CPython; none occurs in a hash input (keys are bounded), so refuse them.
 */
static void
pk_data(struct pk *w, bool text, const void *p, size_t n)
{
	boundary(w);
	if (n >= FRAME_TARGET) {
		w->bad = true;
		return;
	}
	if (n < 256) {
		put1(w, text ? OP_SHORT_BINUNICODE : OP_SHORT_BINBYTES);
		put1(w, (uint8_t)n);
	} else {
		put1(w, text ? OP_BINUNICODE : OP_BINBYTES);
		put_le(w, n, 4);
	}
	put(w, p, n);
	put1(w, OP_MEMOIZE);
	w->memo++;
}

/*
 * A tag of vLLM 0.33's tagged keys: one constant object in CPython, so
 * written in full the first time in a block, then fetched from the memo.
 */
static void
pk_tag(struct pk *w, const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < w->ntags; i++) {
		if (w->tags[i].n == n && memcmp(w->tags[i].s, p, n) == 0) {
			uint32_t idx = w->tags[i].idx;
			boundary(w);
			if (idx < 256) {
				put1(w, OP_BINGET);
				put1(w, (uint8_t)idx);
			} else {
				put1(w, OP_LONG_BINGET);
				put_le(w, idx, 4);
			}
			return;
		}
	}
	if (w->ntags == MAX_TAGS) {
		w->bad = true; /* more tags than vLLM has: not an input we know */
		return;
	}
	w->tags[w->ntags].s = p;
	w->tags[w->ntags].n = n;
	w->tags[w->ntags++].idx = w->memo;
	pk_data(w, true, p, n);
}

static void
pk_none(struct pk *w)
{
	boundary(w);
	put1(w, OP_NONE);
}

/* save_tuple's head, before the items: a MARK for four or more. */
static void
tuple_begin(struct pk *w, size_t n)
{
	boundary(w);
	if (n > 3)
		put1(w, OP_MARK);
}

/* save_tuple's tail, after the items: TUPLE1..3 or MARK..TUPLE, then memoized. */
static void
tuple_end(struct pk *w, size_t n)
{
	if (n == 0) {
		put1(w, OP_EMPTY_TUPLE); /* the empty tuple is not memoized */
	} else {
		put1(w, n <= 3 ? (uint8_t)(OP_TUPLE1 + n - 1) : OP_TUPLE);
		put1(w, OP_MEMOIZE);
		w->memo++;
	}
}

/*
 * One canonical CBOR item of the extra-keys subset, as the Python object vLLM
 * pickles. tag: the item is the first of a key tuple in tagged keys.
 */
static size_t
pk_cbor(struct pk *w, const uint8_t *p, size_t n, int depth, bool tag)
{
	unsigned major, info;
	uint64_t arg = 0;
	size_t h = 1;

	if (n == 0 || depth > MAX_DEPTH)
		return 0;
	if (p[0] == 0xf6) {
		pk_none(w);
		return 1;
	}
	major = p[0] >> 5;
	info = p[0] & 31;
	if (info < 24) {
		arg = info;
	} else if (info <= 27) {
		size_t k = (size_t)1 << (info - 24);
		if (n < 1 + k)
			return 0;
		for (size_t i = 0; i < k; i++)
			arg = (arg << 8) | p[1 + i];
		h += k;
	} else {
		return 0;
	}
	switch (major) {
	case 0:
	case 1:
		if (arg > INT64_MAX)
			return 0;
		pk_int(w, major == 0 ? (int64_t)arg : -1 - (int64_t)arg);
		return h;
	case 2:
	case 3:
		if (arg > n - h)
			return 0;
		if (tag && major == 3)
			pk_tag(w, p + h, (size_t)arg);
		else
			pk_data(w, major == 3, p + h, (size_t)arg);
		return h + (size_t)arg;
	case 4: {
		if (arg > n - h)
			return 0; /* every item takes a byte at least */
		tuple_begin(w, (size_t)arg);
		for (uint64_t i = 0; i < arg; i++) {
			/* The extra keys (depth 0) hold key tuples (depth 1) led by a tag. */
			size_t used = pk_cbor(w, p + h, n - h, depth + 1, w->tagged && depth == 1 && i == 0);
			if (used == 0)
				return 0;
			h += used;
		}
		tuple_end(w, (size_t)arg);
		return h;
	}
	default:
		return 0;
	}
}

size_t
kvp_pickle_block_bound(size_t parent_len, size_t num_tokens, size_t extra_len)
{
	size_t base;

	/* An int is at most 10 bytes; a CBOR byte becomes at most 10 pickle bytes. */
	if (num_tokens > SIZE_MAX / 64 || extra_len > SIZE_MAX / 64 || parent_len > 255)
		return SIZE_MAX;
	base = 64 + parent_len + 10 * num_tokens + 10 * (extra_len ? extra_len : 1);
	return base + FRAME_HDR * (base / FRAME_TARGET + 1);
}

int
kvp_pickle_block(const uint8_t *parent, size_t parent_len, const int64_t *tokens, size_t n,
                 const uint8_t *extra, size_t extra_len, unsigned flags, uint8_t *buf,
                 size_t cap, size_t *len)
{
	struct pk w;

	if (parent == NULL || parent_len > 255 || (tokens == NULL && n > 0) ||
	    (extra == NULL && extra_len > 0) || buf == NULL || len == NULL ||
	    (flags & ~KVP_PICKLE_TAGS) != 0)
		return KVP_EINVAL;
	begin(&w, buf, cap);
	w.tagged = (flags & KVP_PICKLE_TAGS) != 0;
	tuple_begin(&w, 3);
	pk_data(&w, false, parent, parent_len);
	tuple_begin(&w, n);
	for (size_t i = 0; i < n; i++)
		pk_int(&w, tokens[i]);
	tuple_end(&w, n);
	if (extra_len == 0)
		pk_none(&w);
	else if (pk_cbor(&w, extra, extra_len, 0, false) != extra_len)
		return KVP_EINVAL; /* not exactly one item */
	tuple_end(&w, 3);
	return end(&w, len);
}

int
kvp_pickle_str(const char *s, uint8_t *buf, size_t cap, size_t *len)
{
	struct pk w;

	if (s == NULL || buf == NULL || len == NULL)
		return KVP_EINVAL;
	begin(&w, buf, cap);
	pk_data(&w, true, s, strlen(s));
	return end(&w, len);
}
