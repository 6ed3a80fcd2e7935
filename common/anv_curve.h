/*  anv_curve.h - CURVE keys: loading zcert files, applying them to sockets, making key pairs.

    Keys are CZMQ zcert text files: NAME.key holds the public key (`curve / public-key = "Z85"`),
    NAME.key_secret the public and the secret key (mode 0600). A process loads its own secret
    file and, when it connects, the server's public file; anv_curve_server() / _client() turn a
    zsock_t into a CURVE server or client before it binds or connects. Loading checks what
    would otherwise fail silently at the handshake: the file exists, holds 40-character Z85
    keys, and its public key is the one its secret key derives. The keys are copied into the
    object (no CZMQ object is kept), so a loaded anv_curve_t may be read from any thread.

    anv_curve_endpoint_local() says whether an endpoint stays on this host (ipc://, inproc://,
    tcp:// on 127.0.0.0/8, ::1 or localhost): only those may carry plaintext without --insecure.
*/
#ifndef ANV_CURVE_H
#define ANV_CURVE_H

#include <czmq.h>
#include <stdbool.h>
#include <stddef.h>

#define ANV_CURVE_KEY_TXT 41 /* 40 Z85 characters and a NUL */

typedef struct anv_curve_t anv_curve_t;

/* Loads the own key pair from `secret_file` (a NAME.key_secret file; given NAME.key, its
   NAME.key_secret is used) and, when `server_file` is not NULL or "", the server's public key
   from it (a NAME.key file; a secret file works too, only its public key is read). Returns
   NULL with the reason in err. */
anv_curve_t *anv_curve_new(const char *secret_file, const char *server_file, char *err,
                           size_t errlen);
void anv_curve_destroy(anv_curve_t **self_p);

/* Config helper for the connecting side: both empty = no CURVE (*out = NULL, returns 0); both
   given = loaded into *out; one without the other, or a file that does not load, =
   ANV_ECONFIG with the reason in err. */
int anv_curve_client_config(const char *secret_file, const char *server_file, anv_curve_t **out,
                            char *err, size_t errlen);

/* Makes sock a CURVE server with the own key (call before bind). `domain` (e.g. "worker") is
   the ZAP domain: the authenticator sees it with every handshake on this socket. */
void anv_curve_server(const anv_curve_t *self, zsock_t *sock, const char *domain);
/* Makes sock a CURVE client of the loaded server key (call before connect). Returns 0, or
   ANV_ECONFIG when no server key was loaded. */
int anv_curve_client(const anv_curve_t *self, zsock_t *sock);
/* The own public key in Z85 (borrowed). */
const char *anv_curve_public_txt(const anv_curve_t *self);

/* Reads the public key of a zcert file (public or secret) into pub (ANV_CURVE_KEY_TXT bytes).
   Returns 0, -errno when the file cannot be read, or ANV_EFORMAT (reason in err). */
int anv_curve_read_public(const char *file, char *pub, char *err, size_t errlen);

/* Watches sock's handshakes (libzmq socket monitor, before connect): returns a PAIR socket the
   caller polls and destroys before sock, or NULL when the monitor cannot start. */
zsock_t *anv_curve_monitor_new(zsock_t *sock);
/* Reads what the monitor has without blocking. Returns 0 (nothing, or handshakes that
   succeeded), ANV_EAUTH (the server refused our key: ZAP said no), or ANV_EPROTO (the handshake
   failed otherwise: wrong server key, or one side uses CURVE and the other does not). */
int anv_curve_monitor_read(zsock_t *monitor);

/* True when `endpoint` cannot be reached from another host (see the top of this file). */
bool anv_curve_endpoint_local(const char *endpoint);

/* Writes a new key pair as DIR/NAME.key and DIR/NAME.key_secret (mode 0600), with `name` in the
   metadata. Refuses to replace existing files unless `force`. The public key goes to pub when
   not NULL. Returns 0, -EEXIST, -errno or ANV_ECONFIG (a bad name) with the reason in err. */
int anv_curve_keygen(const char *dir, const char *name, bool force, char *pub, char *err,
                     size_t errlen);

#endif
