/*
 * kvp_status.h: the one status enum of kvpool.
 *
 * Every fallible kvpool function returns one of these. The numbers are the
 * wire's status numbers (proto/ mirrors this table), so they never change
 * once released: add new codes at the end. Names and strings come from one
 * X-macro table so they cannot drift. Human detail strings elsewhere are for
 * logs only; callers branch on the number.
 *
 * Thread-safe (pure functions over constant data).
 */
#ifndef KVP_STATUS_H
#define KVP_STATUS_H

/* X(name, number, text) */
#define KVP_STATUS_TABLE(X)                                                    \
	X(KVP_OK, 0, "ok")                                                     \
	X(KVP_EINVAL, 1, "invalid argument")                                   \
	X(KVP_ENOSPACE, 2, "not enough free blocks (caller must preempt)")     \
	X(KVP_ENOTFOUND, 3, "not found")                                       \
	X(KVP_ESTATE, 4, "wrong state")                                        \
	X(KVP_ENOTOWNER, 5, "not owner")                                       \
	X(KVP_EUNKNOWNPOOL, 6, "unknown pool")                                 \
	X(KVP_EVERSION, 7, "unsupported protocol version")                    \
	X(KVP_ETOOLARGE, 8, "message too large")                               \
	X(KVP_EUNAUTH, 9, "unauthenticated")                                   \
	X(KVP_EBUSY, 10, "busy")                                               \
	X(KVP_EINTERNAL, 11, "internal error")                                 \
	X(KVP_ERANGE, 12, "block id out of range")                             \
	X(KVP_ENOMEM, 13, "out of memory")                                     \
	X(KVP_ENOTSUP, 14, "not supported")

enum kvp_status {
#define KVP_STATUS_ENUM_(name, num, text) name = num,
	KVP_STATUS_TABLE(KVP_STATUS_ENUM_)
#undef KVP_STATUS_ENUM_
};

/* Number of codes; valid codes are 0 .. KVP_STATUS_COUNT-1. */
#define KVP_STATUS_COUNT 15

/* Returns the human text of a status ("unknown status" for any other int). */
const char *kvp_strerror(int status);

/* Returns the enum name, e.g. "KVP_EINVAL" ("KVP_UNKNOWN" for any other int). */
const char *kvp_status_name(int status);

#endif /* KVP_STATUS_H */
