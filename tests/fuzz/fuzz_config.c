/*  fuzz_config.c - fuzz target: the model's config.json (and generation_config.json) through
    eng_config_load, as the engine reads them from a checkpoint directory.

    Input: config.json, then optionally a NUL and generation_config.json. Whatever the bytes,
    the loader returns 0 or an error with a reason; an accepted config has the invariants the
    forward pass divides and allocates by (positive sizes, whole heads, GQA groups, at most
    ENG_MAX_EOS eos ids).
*/
#include "anv_error.h"
#include "eng_config.h"
#include "fuzz_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    size_t alen, blen;
    const uint8_t *b;
    fuzz_split(data, size, &alen, &b, &blen);
    fuzz_write("config.json", data, alen);
    fuzz_write("generation_config.json", b, blen);
    eng_model_config_t cfg;
    char err[512] = "";
    int rc = eng_config_load(fuzz_dir(), &cfg, err, sizeof err);
    if (rc != 0) {
        if (!err[0] || rc > 0)
            abort();
        return 0;
    }
    if (cfg.hidden <= 0 || cfg.n_layers <= 0 || cfg.n_heads <= 0 || cfg.n_kv_heads <= 0 ||
        cfg.head_dim <= 0 || cfg.ffn <= 0 || cfg.vocab <= 0 || cfg.n_heads % cfg.n_kv_heads ||
        cfg.n_eos < 0 || cfg.n_eos > ENG_MAX_EOS || !memchr(cfg.arch_name, 0, sizeof cfg.arch_name))
        abort();
    return 0;
}
