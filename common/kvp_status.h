/* SPDX-License-Identifier: Apache-2.0 */
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

/* X(name, number, wire name (kvpool.proto's STATUS_<wire name>), text) */
#define KVP_STATUS_TABLE(X)                                                            \
	X(KVP_OK, 0, "OK", "ok")                                                       \
	X(KVP_EINVAL, 1, "INVALID_ARGUMENT", "invalid argument")                       \
	X(KVP_ENOSPACE, 2, "NO_SPACE", "not enough free blocks (caller must preempt)") \
	X(KVP_ENOTFOUND, 3, "NOT_FOUND", "not found")                                  \
	X(KVP_ESTATE, 4, "WRONG_STATE", "wrong state")                                 \
	X(KVP_ENOTOWNER, 5, "NOT_OWNER", "not owner")                                  \
	X(KVP_EUNKNOWNPOOL, 6, "UNKNOWN_POOL", "unknown pool")                         \
	X(KVP_EVERSION, 7, "UNSUPPORTED_VERSION", "unsupported protocol version")      \
	X(KVP_ETOOLARGE, 8, "MESSAGE_TOO_LARGE", "message too large")                  \
	X(KVP_EUNAUTH, 9, "UNAUTHENTICATED", "unauthenticated")                        \
	X(KVP_EBUSY, 10, "BUSY", "busy")                                               \
	X(KVP_EINTERNAL, 11, "INTERNAL", "internal error")                             \
	X(KVP_ERANGE, 12, "OUT_OF_RANGE", "block id out of range")                     \
	X(KVP_ENOMEM, 13, "NO_MEMORY", "out of memory")                                \
	X(KVP_ENOTSUP, 14, "NOT_SUPPORTED", "not supported")                           \
	X(KVP_ENODEVICE, 15, "NO_DEVICE", "no usable accelerator device")              \
	X(KVP_EUNAVAILABLE, 16, "UNAVAILABLE", "cannot connect to the daemon")                \
	X(KVP_EDEADLINE, 17, "DEADLINE_EXCEEDED", "the call's deadline passed before it ran")  \
	X(KVP_EQUOTA, 18, "QUOTA_EXCEEDED", "the session's quota on the pool would be passed")

enum kvp_status {
#define KVP_STATUS_ENUM_(name, num, wire, text) name = num,
	KVP_STATUS_TABLE(KVP_STATUS_ENUM_)
#undef KVP_STATUS_ENUM_
};

/* Number of codes; valid codes are 0 .. KVP_STATUS_COUNT-1. */
#define KVP_STATUS_COUNT 19

/* Returns the human text of a status ("unknown status" for any other int). */
const char *kvp_strerror(int status);

/* Returns the enum name, e.g. "KVP_EINVAL" ("KVP_UNKNOWN" for any other int). */
const char *kvp_status_name(int status);

/* Returns the wire name, e.g. "INVALID_ARGUMENT" ("UNKNOWN" for any other int). */
const char *kvp_status_wire_name(int status);

#endif /* KVP_STATUS_H */
