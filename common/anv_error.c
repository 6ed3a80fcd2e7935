/*  anv_error.c - names of Anvil error codes.

    Anvil's own codes get fixed names; anything else is taken as a negative errno and named by
    strerror(), which glibc makes thread-safe for known values.
*/
#include "anv_error.h"

#include <string.h>

const char *anv_strerror(int code)
{
    switch (code) {
    case ANV_OK:
        return "ok";
    case ANV_EPROTO:
        return "malformed message";
    case ANV_EVERSION:
        return "wrong protocol version";
    case ANV_ETOOBIG:
        return "over the size limit";
    case ANV_EREDIS:
        return "redis error";
    case ANV_ECONFIG:
        return "bad configuration";
    case ANV_EFORMAT:
        return "malformed input";
    case ANV_ENOTFOUND:
        return "not found";
    case ANV_ETIMEOUT:
        return "timed out";
    case ANV_ECANCELLED:
        return "cancelled";
    case ANV_EUNSUPPORTED:
        return "unsupported";
    case ANV_ESTATE:
        return "invalid state";
    case ANV_EAUTH:
        return "authentication refused";
    case ANV_EINTERNAL:
        return "internal error";
    default:
        break;
    }
    if (code < 0 && code > -ANV_EBASE)
        return strerror(-code);
    return "unknown error";
}
