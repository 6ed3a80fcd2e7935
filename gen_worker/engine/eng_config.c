/*  eng_config.c - config.json / generation_config.json parsing with cJSON.

    Integers must be positive and within limits that keep every derived size inside int and
    size_t; the head layout must be consistent (n_heads a multiple of n_kv_heads, an even
    head_dim). A missing generation_config.json is fine; a malformed one is an error.
*/
#include "eng_config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "anv_error.h"

char *eng_read_file(const char *path, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 65536 + 1 > cap) {
            cap = (len + 65536 + 1) * 2;
            char *p = realloc(buf, cap);
            if (!p) {
                free(buf);
                fclose(f);
                errno = ENOMEM;
                return NULL;
            }
            buf = p;
        }
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        errno = EIO;
        return NULL;
    }
    buf[len] = 0;
    if (len_out)
        *len_out = len;
    return buf;
}

static cJSON *s_load_json(const char *path, char *err, size_t errlen, int *rc)
{
    size_t len;
    char *text = eng_read_file(path, &len);
    if (!text) {
        *rc = -errno;
        snprintf(err, errlen, "cannot read '%s': %s", path, strerror(errno));
        return NULL;
    }
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        *rc = ANV_EFORMAT;
        snprintf(err, errlen, "'%s' is not a JSON object", path);
        return NULL;
    }
    return j;
}

/* Reads key as an integer in [lo, hi]; absent -> def (def < lo means required). */
static int
s_int(const cJSON *o, const char *key, int lo, int hi, int def, int *out, char *err, size_t errlen)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!j || cJSON_IsNull(j)) {
        if (def < lo) {
            snprintf(err, errlen, "config.json: '%s' is missing", key);
            return ANV_EFORMAT;
        }
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble) || j->valuedouble < lo ||
        j->valuedouble > hi) {
        snprintf(err, errlen, "config.json: '%s' must be an integer in [%d, %d]", key, lo, hi);
        return ANV_EFORMAT;
    }
    *out = (int)j->valuedouble;
    return 0;
}

static int s_float(const cJSON *o,
                   const char *key,
                   double lo,
                   double hi,
                   double def,
                   float *out,
                   char *err,
                   size_t errlen)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!j || cJSON_IsNull(j)) {
        *out = (float)def;
        return 0;
    }
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= lo && j->valuedouble <= hi)) {
        snprintf(err, errlen, "config.json: '%s' must be a number in [%g, %g]", key, lo, hi);
        return ANV_EFORMAT;
    }
    *out = (float)j->valuedouble;
    return 0;
}

static bool s_bool(const cJSON *o, const char *key, bool def)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(j) ? cJSON_IsTrue(j) : def;
}

/* A JSON number in [lo, hi] (and whole when `whole`): anything else, huge or fractional
   values included, is refused before a cast could overflow (the fuzzer found eos ids of 1e66). */
static bool s_num_in(const cJSON *j, double lo, double hi, bool whole)
{
    return cJSON_IsNumber(j) && j->valuedouble >= lo && j->valuedouble <= hi &&
           (!whole || j->valuedouble == floor(j->valuedouble));
}

static int s_add_eos(eng_model_config_t *cfg, const cJSON *j, const char *file, char *err,
                     size_t errlen)
{
    if (cJSON_IsNumber(j)) {
        if (!s_num_in(j, 0, 2147483647.0, true)) {
            snprintf(err, errlen, "%s: eos_token_id %g is not a token id", file, j->valuedouble);
            return ANV_EFORMAT;
        }
        int id = (int)j->valuedouble;
        for (int i = 0; i < cfg->n_eos; i++)
            if (cfg->eos_ids[i] == id)
                return 0;
        if (cfg->n_eos < ENG_MAX_EOS)
            cfg->eos_ids[cfg->n_eos++] = id;
    } else if (cJSON_IsArray(j)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, j)
        {
            int rc = s_add_eos(cfg, e, file, err, errlen);
            if (rc)
                return rc;
        }
    }
    return 0;
}

static int s_generation_config(const char *dir, eng_model_config_t *cfg, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/generation_config.json", dir);
    int rc = 0;
    cJSON *g = s_load_json(path, err, errlen, &rc);
    if (!g)
        return rc == -ENOENT ? 0 : rc;
    const char *bad = NULL;
    rc = s_add_eos(cfg, cJSON_GetObjectItemCaseSensitive(g, "eos_token_id"),
                   "generation_config.json", err, errlen);
    if (rc)
        goto out;
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(g, "bos_token_id");
    if (cfg->bos_id < 0 && cJSON_IsNumber(b)) {
        if (!s_num_in(b, 0, 2147483647.0, true))
            bad = "bos_token_id";
        else
            cfg->bos_id = (int)b->valuedouble;
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(g, "temperature");
    if (!bad && cJSON_IsNumber(t)) {
        if (!s_num_in(t, 0, 1e6, false))
            bad = "temperature";
        cfg->has_temperature = true;
        cfg->temperature = bad ? 0 : (float)t->valuedouble;
    }
    t = cJSON_GetObjectItemCaseSensitive(g, "top_p");
    if (!bad && cJSON_IsNumber(t)) {
        if (!s_num_in(t, 0, 1, false))
            bad = "top_p";
        cfg->has_top_p = true;
        cfg->top_p = bad ? 1 : (float)t->valuedouble;
    }
    t = cJSON_GetObjectItemCaseSensitive(g, "top_k");
    if (!bad && cJSON_IsNumber(t)) {
        if (!s_num_in(t, 0, 2147483647.0, true))
            bad = "top_k";
        cfg->has_top_k = true;
        cfg->top_k = bad ? 0 : (int)t->valuedouble;
    }
    if (bad) {
        snprintf(err, errlen, "generation_config.json: '%s' is out of range", bad);
        rc = ANV_EFORMAT;
    }
out:
    cJSON_Delete(g);
    return rc;
}

int eng_config_load(const char *dir, eng_model_config_t *cfg, char *err, size_t errlen)
{
    char path[4096];
    int rc = 0;
    memset(cfg, 0, sizeof(*cfg));
    snprintf(path, sizeof(path), "%s/config.json", dir);
    cJSON *c = s_load_json(path, err, errlen, &rc);
    if (!c)
        return rc;
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(c, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    if (!cJSON_IsString(a0)) {
        snprintf(err, errlen, "config.json: 'architectures' is missing");
        rc = ANV_EFORMAT;
        goto out;
    }
    snprintf(cfg->arch_name, sizeof(cfg->arch_name), "%s", a0->valuestring);
    if (strcmp(a0->valuestring, "LlamaForCausalLM") == 0) {
        cfg->arch = ENG_ARCH_LLAMA;
    } else if (strcmp(a0->valuestring, "Qwen2ForCausalLM") == 0) {
        cfg->arch = ENG_ARCH_QWEN2;
    } else {
        snprintf(err, errlen,
                 "config.json: unsupported architecture '%s' (supported: LlamaForCausalLM, "
                 "Qwen2ForCausalLM)",
                 a0->valuestring);
        rc = ANV_EUNSUPPORTED;
        goto out;
    }
    const int big = 1 << 24;
    if ((rc = s_int(c, "hidden_size", 1, big, -1, &cfg->hidden, err, errlen)) ||
        (rc = s_int(c, "num_hidden_layers", 1, 4096, -1, &cfg->n_layers, err, errlen)) ||
        (rc = s_int(c, "num_attention_heads", 1, 4096, -1, &cfg->n_heads, err, errlen)) ||
        (rc = s_int(c, "num_key_value_heads", 1, 4096, cfg->n_heads, &cfg->n_kv_heads, err,
                    errlen)) ||
        (rc = s_int(c, "head_dim", 2, 4096, cfg->hidden / cfg->n_heads, &cfg->head_dim, err,
                    errlen)) ||
        (rc = s_int(c, "intermediate_size", 1, big, -1, &cfg->ffn, err, errlen)) ||
        (rc = s_int(c, "vocab_size", 1, big, -1, &cfg->vocab, err, errlen)) ||
        (rc = s_int(c, "max_position_embeddings", 1, big, 4096, &cfg->max_pos, err, errlen)) ||
        (rc = s_int(c, "bos_token_id", -1, big, -1, &cfg->bos_id, err, errlen)) ||
        (rc = s_float(c, "rope_theta", 1.0, 1e12, 10000.0, &cfg->rope_theta, err, errlen)) ||
        (rc = s_float(c, "rms_norm_eps", 0.0, 1.0, 1e-6, &cfg->rms_eps, err, errlen)))
        goto out;
    rc = ANV_EFORMAT;
    if (cfg->n_heads % cfg->n_kv_heads) {
        snprintf(err, errlen,
                 "config.json: num_attention_heads %d is not a multiple of "
                 "num_key_value_heads %d",
                 cfg->n_heads, cfg->n_kv_heads);
        goto out;
    }
    if (cfg->head_dim % 2) {
        snprintf(err, errlen, "config.json: head_dim %d is odd", cfg->head_dim);
        goto out;
    }
    rc = ANV_EUNSUPPORTED;
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(c, "hidden_act");
    if (cJSON_IsString(act) && strcmp(act->valuestring, "silu") != 0) {
        snprintf(err, errlen, "config.json: hidden_act '%s' is not supported (only silu)",
                 act->valuestring);
        goto out;
    }
    /* transformers >= 5 writes {"rope_parameters": {"rope_theta", "rope_type"}} */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(c, "rope_parameters");
    if (cJSON_IsObject(rp) && !cJSON_GetObjectItemCaseSensitive(c, "rope_theta")) {
        rc = s_float(rp, "rope_theta", 1.0, 1e12, 10000.0, &cfg->rope_theta, err, errlen);
        if (rc)
            goto out;
        rc = ANV_EUNSUPPORTED;
    }
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(c, "rope_scaling");
    if (!rs || cJSON_IsNull(rs))
        rs = rp;
    if (rs && !cJSON_IsNull(rs)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
        if (!ty)
            ty = cJSON_GetObjectItemCaseSensitive(rs, "type");
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "default") != 0) {
            snprintf(err, errlen, "config.json: rope_scaling '%s' is not supported",
                     cJSON_IsString(ty) ? ty->valuestring : "?");
            goto out;
        }
    }
    if (s_bool(c, "mlp_bias", false)) {
        snprintf(err, errlen, "config.json: mlp_bias is not supported");
        goto out;
    }
    if (cfg->arch == ENG_ARCH_QWEN2 && s_bool(c, "use_sliding_window", false)) {
        snprintf(err, errlen, "config.json: use_sliding_window is not supported");
        goto out;
    }
    cfg->qkv_bias = cfg->arch == ENG_ARCH_QWEN2 || s_bool(c, "attention_bias", false);
    cfg->tied_embeddings = s_bool(c, "tie_word_embeddings", false);
    rc = s_add_eos(cfg, cJSON_GetObjectItemCaseSensitive(c, "eos_token_id"), "config.json", err,
                   errlen);
    if (rc == 0)
        rc = s_generation_config(dir, cfg, err, errlen);
out:
    cJSON_Delete(c);
    return rc;
}
