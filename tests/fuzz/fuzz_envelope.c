/*  fuzz_envelope.c - fuzz target: one ZeroMQ payload into the envelope decoder.

    Whatever the bytes, anv_msg_decode must return an envelope or a clean error; a decoded
    envelope must re-encode and decode to the same bytes-length, and be freed without leaks.
    Built as a libFuzzer target with clang (-fsanitize=fuzzer) and, with any compiler, as a
    replay binary that runs the committed corpus (tests/fuzz/corpus/envelope) as a regression
    test.
*/
#include "anv_error.h"
#include "anv_log.h"
#include "anv_msg.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    if (!quiet) {
        anv_log_set_level(ANV_LOG_ERROR);
        quiet = 1;
    }
    int err = 0;
    Anvil__Envelope *env = anv_msg_decode(data, size, 1u << 20, &err);
    if (!env) {
        if (err != ANV_EPROTO && err != ANV_EVERSION && err != ANV_ETOOBIG)
            abort();
        return 0;
    }
    (void)anv_msg_body_name(env);
    size_t len = 0;
    uint8_t *again = anv_msg_encode(env, &len);
    if (!again)
        abort();
    int err2 = 0;
    Anvil__Envelope *env2 = anv_msg_decode(again, len, 0, &err2);
    if (!env2 || env2->body_case != env->body_case)
        abort(); /* what we accept, we must be able to send on */
    size_t len2 = 0;
    uint8_t *third = anv_msg_encode(env2, &len2);
    if (!third || len2 != len || memcmp(third, again, len) != 0)
        abort(); /* canonical after one round */
    free(third);
    free(again);
    anv_msg_free(&env2);
    anv_msg_free(&env);
    return 0;
}
