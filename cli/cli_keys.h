/*  cli_keys.h - `anvil keys gen`: CURVE key pairs for the broker, clients and workers.

    A key pair is two zcert files (anv_curve.h): NAME.key (public, give it away) and
    NAME.key_secret (mode 0600, stays on its host). The standard set made by `--all` and by
    `anvil up --curve` is broker, client and worker, plus allow/ holding copies of the client
    and worker public keys: the directory the broker's --curve-allow names.
*/
#ifndef CLI_KEYS_H
#define CLI_KEYS_H

#include <stdbool.h>
#include <stddef.h>

/* Makes DIR (0700), the broker, client and worker pairs in it and DIR/allow with the client
   and worker public keys. Existing pairs are an error (-EEXIST) unless `force` replaces them
   or `reuse` keeps them (the allow/ copies are then made again from them). Returns 0, or a
   negative code with the reason in err. */
int cli_keys_make_set(const char *dir, bool force, bool reuse, char *err, size_t errlen);

#endif
