/*  anv_error.h - error codes shared by every Anvil component.

    Actions return 0 or a negative code. Negative errno values (-ENOMEM, -EINVAL, ...) are valid
    codes as they are; Anvil's own codes start at ANV_EBASE, well above any errno, so the two
    never collide. anv_strerror() names either kind.
*/
#ifndef ANV_ERROR_H
#define ANV_ERROR_H

#define ANV_OK 0
#define ANV_EBASE 10000
#define ANV_EPROTO (-(ANV_EBASE + 1))     /* malformed or truncated message */
#define ANV_EVERSION (-(ANV_EBASE + 2))   /* wrong protocol version */
#define ANV_ETOOBIG (-(ANV_EBASE + 3))    /* message or input over its size limit */
#define ANV_EREDIS (-(ANV_EBASE + 4))     /* Redis error reply or lost connection */
#define ANV_ECONFIG (-(ANV_EBASE + 5))    /* bad configuration value */
#define ANV_EFORMAT (-(ANV_EBASE + 6))    /* malformed input file (JSONL, model files, ...) */
#define ANV_ENOTFOUND (-(ANV_EBASE + 7))  /* unknown job, worker, key, ... */
#define ANV_ETIMEOUT (-(ANV_EBASE + 8))   /* deadline passed */
#define ANV_ECANCELLED (-(ANV_EBASE + 9)) /* cancelled by a client */
#define ANV_EUNSUPPORTED (-(ANV_EBASE + 10))
#define ANV_ESTATE (-(ANV_EBASE + 11))    /* operation not valid in the current state */
#define ANV_EAUTH (-(ANV_EBASE + 12))     /* refused by authentication */
#define ANV_EINTERNAL (-(ANV_EBASE + 13))

/* Returns a static string naming `code` (an ANV_E* code or a negative errno). */
const char *anv_strerror(int code);

#endif
