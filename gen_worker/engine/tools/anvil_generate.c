/*  anvil_generate.c - anvil-generate: model directory + prompts -> completions, one JSON line
    per sample; the oracle other tools and the CUDA backend's checks script against.

      anvil-generate --model DIR [--prompt TEXT | --prompts FILE.jsonl] [--chat]
                     [--max-tokens N] [--temperature T] [--top-p P] [--top-k K] [--min-p M]
                     [--seed S] [--n N] [--backend cpu|cuda] [--json] ...
      anvil-generate --model DIR --tokenize TEXT [--chat] --json    (the token ids alone)
      anvil-generate --model DIR --tokenize-jsonl FILE              (ids + decode, per line)

    A sample line: {"id", "index", "seed", "prompt_tokens", "token_ids", "text", "logprobs",
    "finish_reason", "weight_version"} (+ "top_logprobs" with --top-logprobs K). Text that is
    not valid UTF-8 is printed with U+FFFD replacements (plain and JSON); token_ids are exact. JSONL prompt
    lines: {"prompt": TEXT | "prompt_ids": [ids], "id"?, "n"?, "seed"?, "max_tokens"?,
    "chat"?}. A run's figures (tokens/s, KV blocks) go to stderr as one log line.
    Exit status: 0, 1 for a model/engine error, 2 for bad arguments or input.
*/
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "anv_config.h"
#include "anv_error.h"
#include "anv_jsonl.h"
#include "anv_log.h"
#include "anv_time.h"
#include "eng_config.h"
#include "eng_engine.h"

typedef struct {
    char *model, *prompt, *prompts, *tokenize, *tokenize_jsonl, *backend, *seed, *stop, *stop_ids,
        *log_level, *kv_dtype;
    int64_t max_tokens, top_k, n, threads, block_size, kv_blocks, max_batch_tokens, max_context,
        top_logprobs, max_seqs;
    double temperature, top_p, min_p;
    bool chat, json, ignore_eos, no_prefix_sharing, cuda_graphs;
} s_args_t;

/* s[0, n) as a quoted JSON string (caller frees): repaired to valid UTF-8 (U+FFFD), and
   escaped byte by byte, so an embedded NUL survives as \u0000 (cJSON's strings stop there).
   NULL when out of memory. */
static char *s_json_text(const char *s, size_t n)
{
    size_t un = 0;
    char *u = eng_utf8_lossy_len(s, n, &un);
    eng_buf_t out = {0};
    int rc = u ? eng_buf_append(&out, "\"", 1) : -ENOMEM;
    for (size_t i = 0; i < un && !rc; i++) {
        unsigned char c = (unsigned char)u[i];
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            rc = eng_buf_append(&out, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof(esc), "\\u%04x", c);
            rc = eng_buf_append(&out, esc, 6);
        } else {
            rc = eng_buf_append(&out, &u[i], 1);
        }
    }
    rc = rc ? rc : eng_buf_append(&out, "\"", 1);
    free(u);
    if (rc)
        eng_buf_release(&out);
    return out.p;
}

static void s_print_sample(const eng_sample_t *s, bool json)
{
    if (!json) {
        printf("--- %s #%d (%s, %d tokens)\n", s->request_id, s->index, eng_finish_name(s->finish),
               s->n_tokens);
        size_t un = 0;
        char *u = eng_utf8_lossy_len(s->text, s->text_len, &un);
        if (u)
            fwrite(u, 1, un, stdout);
        free(u);
        putchar('\n');
        return;
    }
    char *text = s_json_text(s->text, s->text_len);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", s->request_id);
    cJSON_AddNumberToObject(o, "index", s->index);
    char seed[32];
    snprintf(seed, sizeof(seed), "%llu", (unsigned long long)s->seed);
    cJSON_AddRawToObject(o, "seed", seed);
    cJSON_AddNumberToObject(o, "prompt_tokens", s->n_prompt);
    cJSON *ids = cJSON_AddArrayToObject(o, "token_ids");
    cJSON *lps = cJSON_AddArrayToObject(o, "logprobs");
    for (int i = 0; i < s->n_tokens; i++) {
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(s->tokens[i]));
        char num[32];
        snprintf(num, sizeof(num), "%.9g", (double)s->logprobs[i]);
        cJSON_AddItemToArray(lps, cJSON_CreateRaw(num));
    }
    cJSON_AddRawToObject(o, "text", text ? text : "\"\"");
    cJSON_AddStringToObject(o, "finish_reason", eng_finish_name(s->finish));
    cJSON_AddNumberToObject(o, "weight_version", (double)s->weight_version);
    if (s->n_top && s->top) {
        cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs");
        for (int i = 0; i < s->n_tokens; i++) {
            cJSON *row = cJSON_CreateArray();
            for (int k = 0; k < s->n_top; k++) {
                const eng_top_t *t = &s->top[(size_t)i * s->n_top + k];
                cJSON *e = cJSON_CreateObject();
                cJSON_AddNumberToObject(e, "id", t->id);
                char num[32];
                snprintf(num, sizeof(num), "%.9g", (double)t->logprob);
                cJSON_AddRawToObject(e, "logprob", num);
                cJSON_AddItemToArray(row, e);
            }
            cJSON_AddItemToArray(tops, row);
        }
    }
    char *line = cJSON_PrintUnformatted(o);
    if (line)
        anv_jsonl_write(line, stdout);
    free(line);
    cJSON_Delete(o);
    free(text);
}

/* True when a JSON line escapes a NUL character (an odd run of backslashes before u0000). */
static bool s_has_nul_escape(const char *line)
{
    for (const char *p = strstr(line, "u0000"); p; p = strstr(p + 1, "u0000")) {
        int bs = 0;
        for (const char *q = p - 1; q >= line && *q == '\\'; q--)
            bs++;
        if (bs % 2 == 1)
            return true;
    }
    return false;
}

static int s_print_ids(const eng_ids_t *ids, const char *decoded, size_t dlen, bool json)
{
    if (!json) {
        for (int i = 0; i < ids->n; i++)
            printf("%s%d", i ? " " : "", ids->v[i]);
        putchar('\n');
        return 0;
    }
    cJSON *arr = ids->n ? cJSON_CreateIntArray(ids->v, ids->n) : cJSON_CreateArray();
    cJSON *out = arr;
    if (decoded) {
        out = cJSON_CreateObject();
        cJSON_AddItemToObject(out, "ids", arr);
        char *t = s_json_text(decoded, dlen);
        cJSON_AddRawToObject(out, "decoded", t ? t : "\"\"");
        free(t);
    }
    char *line = cJSON_PrintUnformatted(out);
    if (line)
        anv_jsonl_write(line, stdout);
    free(line);
    cJSON_Delete(out);
    return 0;
}

/* --tokenize-jsonl: each line a JSON string (or {"text": s}); prints ids and decode(ids). */
static int s_tokenize_file(eng_engine_t *e, const char *path, bool chat)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        ANV_ERROR("cannot open '%s': %s", path, strerror(errno));
        return 2;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int lineno = 0, rc = 0;
    while (!rc && (n = getline(&line, &cap, f)) > 0) {
        lineno++;
        cJSON *j = cJSON_ParseWithLength(line, (size_t)n);
        const cJSON *t = cJSON_IsString(j) ? j : cJSON_GetObjectItemCaseSensitive(j, "text");
        if (s_has_nul_escape(line)) {
            ANV_ERROR("'%s' line %d: NUL characters (\\u0000) are not supported", path, lineno);
            rc = 2;
        } else if (!cJSON_IsString(t)) {
            ANV_ERROR("'%s' line %d: not a JSON string or {\"text\": ...}", path, lineno);
            rc = 2;
        } else {
            eng_ids_t ids = {0};
            eng_buf_t dec = {0};
            int erc = eng_engine_encode_prompt(e, t->valuestring, chat, &ids);
            if (!erc)
                erc = eng_tokenizer_decode(eng_engine_tokenizer(e), ids.v, ids.n, &dec);
            if (erc) {
                ANV_ERROR("'%s' line %d: cannot tokenize: %s", path, lineno, anv_strerror(erc));
                rc = 2;
            } else {
                s_print_ids(&ids, dec.p, dec.n, true);
            }
            eng_ids_release(&ids);
            eng_buf_release(&dec);
        }
        cJSON_Delete(j);
    }
    free(line);
    fclose(f);
    return rc;
}

static int s_submit_line(eng_engine_t *e,
                         const s_args_t *a,
                         eng_request_t base,
                         const char *line,
                         size_t len,
                         int lineno)
{
    char err[256] = "", id[48];
    cJSON *j = cJSON_ParseWithLength(line, len);
    int32_t *ids = NULL;
    int rc = 2;
    if (!cJSON_IsObject(j)) {
        ANV_ERROR("prompts line %d: not a JSON object", lineno);
        goto out;
    }
    if (s_has_nul_escape(line)) { /* cJSON's strings would end there, silently */
        ANV_ERROR("prompts line %d: NUL characters (\\u0000) are not supported", lineno);
        goto out;
    }
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    const cJSON *pids = cJSON_GetObjectItemCaseSensitive(j, "prompt_ids");
    const cJSON *jid = cJSON_GetObjectItemCaseSensitive(j, "id");
    const cJSON *jn = cJSON_GetObjectItemCaseSensitive(j, "n");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(j, "seed");
    const cJSON *jm = cJSON_GetObjectItemCaseSensitive(j, "max_tokens");
    const cJSON *jc = cJSON_GetObjectItemCaseSensitive(j, "chat");
    if (cJSON_IsString(jid))
        snprintf(id, sizeof(id), "%.47s", jid->valuestring);
    else
        snprintf(id, sizeof(id), "%d", lineno);
    base.request_id = id;
    if (cJSON_IsString(p)) {
        base.prompt_text = p->valuestring;
    } else if (cJSON_IsArray(pids)) {
        int n = cJSON_GetArraySize(pids);
        ids = malloc(((size_t)n + 1) * sizeof(int32_t));
        if (!ids)
            goto out;
        for (int i = 0; i < n; i++) {
            const cJSON *x = cJSON_GetArrayItem(pids, i);
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 1e9) {
                ANV_ERROR("prompts line %d: prompt_ids[%d] is not a token id", lineno, i);
                goto out;
            }
            ids[i] = (int32_t)x->valuedouble;
        }
        base.prompt_ids = ids;
        base.n_prompt_ids = n;
    } else {
        ANV_ERROR("prompts line %d: needs \"prompt\" (text) or \"prompt_ids\"", lineno);
        goto out;
    }
    if (cJSON_IsNumber(jn))
        base.n = (int)jn->valuedouble;
    if (cJSON_IsNumber(jm))
        base.max_tokens = (int)jm->valuedouble;
    if (cJSON_IsBool(jc))
        base.chat = cJSON_IsTrue(jc);
    if (cJSON_IsNumber(js)) {
        base.has_seed = true;
        base.seed = (uint64_t)js->valuedouble;
    }
    rc = eng_engine_submit(e, &base, err, sizeof(err));
    if (rc) {
        ANV_ERROR("prompts line %d: %s", lineno, err);
        rc = 2;
    }
out:
    (void)a;
    free(ids);
    cJSON_Delete(j);
    return rc;
}

static int s_generate(eng_engine_t *e, const s_args_t *a, eng_request_t base)
{
    int rc = 0;
    char err[256] = "";
    if (a->prompt && a->prompt[0]) {
        base.request_id = "0";
        base.prompt_text = a->prompt;
        if ((rc = eng_engine_submit(e, &base, err, sizeof(err)))) {
            ANV_ERROR("%s", err);
            return 2;
        }
    } else {
        FILE *f = strcmp(a->prompts, "-") == 0 ? stdin : fopen(a->prompts, "r");
        if (!f) {
            ANV_ERROR("cannot open '%s': %s", a->prompts, strerror(errno));
            return 2;
        }
        char *line = NULL;
        size_t cap = 0;
        ssize_t n;
        int lineno = 0;
        while (!rc && (n = getline(&line, &cap, f)) > 0) {
            lineno++;
            if (strspn(line, " \t\r\n") == (size_t)n)
                continue;
            rc = s_submit_line(e, a, base, line, (size_t)n, lineno);
        }
        free(line);
        if (f != stdin)
            fclose(f);
        if (rc)
            return rc;
    }
    int64_t t0 = anv_now_ns();
    long long steps = 0;
    while (!eng_engine_idle(e)) {
        int n = eng_engine_step(e);
        if (n < 0) {
            ANV_ERROR("engine step failed: %s", anv_strerror(n));
            return 1;
        }
        steps++;
        eng_sample_t *s;
        while ((s = eng_engine_pop_finished(e))) {
            s_print_sample(s, a->json);
            eng_sample_destroy(&s);
        }
    }
    eng_sample_t *s;
    while ((s = eng_engine_pop_finished(e))) { /* e.g. finished at admission */
        s_print_sample(s, a->json);
        eng_sample_destroy(&s);
    }
    fflush(stdout);
    double secs = (double)(anv_now_ns() - t0) / 1e9;
    eng_engine_stats_t st;
    eng_engine_stats(e, &st);
    ANV_INFO("generated %lld tokens in %.3f s (%.1f tok/s), %lld tokens through the model, "
             "%lld steps, kv peak %d of %d blocks (%.2f MiB of %.2f MiB, %zu bytes/block), "
             "%lld preemptions (%lld prompt tokens taken from a sibling), %d sequences in a "
             "step at most (max-seqs %d)",
             st.generated_tokens, secs, secs > 0 ? (double)st.generated_tokens / secs : 0.0,
             st.processed_tokens, steps, st.peak_blocks, st.total_blocks,
             (double)st.peak_blocks * (double)st.bytes_per_block / 1048576.0,
             (double)st.total_blocks * (double)st.bytes_per_block / 1048576.0, st.bytes_per_block,
             st.preemptions, st.reshared_tokens, st.peak_batch_seqs, st.max_seqs);
    return 0;
}

int main(int argc, char **argv)
{
    anv_log_init("anvil-generate");
    s_args_t a = {0};
    const anv_cfg_opt_t opts[] = {
        {"model", ANV_CFG_STR, "", 0, 0, "Hugging Face checkpoint directory", &a.model, false},
        {"prompt", ANV_CFG_STR, "", 0, 0, "one prompt", &a.prompt, false},
        {"prompts", ANV_CFG_STR, "", 0, 0, "JSONL file of prompts ('-' = stdin)", &a.prompts,
         false},
        {"chat", ANV_CFG_BOOL, "false", 0, 0, "apply the chat template", &a.chat, false},
        {"max-tokens", ANV_CFG_INT, "128", 1, 1 << 24, "tokens per sample at most", &a.max_tokens,
         false},
        {"temperature", ANV_CFG_DOUBLE, "1.0", 0, 100, "0 = greedy", &a.temperature, false},
        {"top-p", ANV_CFG_DOUBLE, "1.0", 1e-6, 1, "nucleus mass", &a.top_p, false},
        {"top-k", ANV_CFG_INT, "0", 0, 1 << 24, "0 = off", &a.top_k, false},
        {"min-p", ANV_CFG_DOUBLE, "0", 0, 1, "0 = off", &a.min_p, false},
        {"seed", ANV_CFG_STR, "", 0, 0, "base seed (default: random)", &a.seed, false},
        {"n", ANV_CFG_INT, "1", 1, 4096, "samples per prompt", &a.n, false},
        {"stop", ANV_CFG_STR, "", 0, 0, "a stop string", &a.stop, false},
        {"stop-ids", ANV_CFG_STR, "", 0, 0,
         "token ids that end a sample like EOS (comma-separated, at most 64)", &a.stop_ids, false},
        {"ignore-eos", ANV_CFG_BOOL, "false", 0, 0, "do not stop on EOS", &a.ignore_eos, false},
        {"top-logprobs", ANV_CFG_INT, "0", 0, ENG_MAX_TOP_LOGPROBS, "top logprobs per token",
         &a.top_logprobs, false},
        {"backend", ANV_CFG_STR, "cpu", 0, 0, "cpu or cuda", &a.backend, false},
        {"threads", ANV_CFG_INT, "0", 0, 1024, "CPU threads (0 = one per core)", &a.threads, false},
        {"block-size", ANV_CFG_INT, "16", 1, 1024, "KV block tokens", &a.block_size, false},
        {"kv-dtype", ANV_CFG_STR, "", 0, 0, "KV cache dtype: bf16, f32, fp8 (default: backend's)",
         &a.kv_dtype, false},
        {"kv-blocks", ANV_CFG_INT, "0", 0, 1 << 24,
         "KV blocks (0 = free GPU memory less room for a reload; 256 MiB on CPU)", &a.kv_blocks,
         false},
        {"max-batch-tokens", ANV_CFG_INT, "2048", 1, 1 << 20, "tokens per step",
         &a.max_batch_tokens, false},
        {"max-context", ANV_CFG_INT, "0", 0, 1 << 24, "0 = the model's", &a.max_context, false},
        {"no-prefix-sharing", ANV_CFG_BOOL, "false", 0, 0, "prefill each sample separately",
         &a.no_prefix_sharing, false},
        {"max-seqs", ANV_CFG_INT, "0", 0, 1 << 20,
         "running sequences at most (0 = 512 on cuda, 256 on cpu)", &a.max_seqs, false},
        {"cuda-graphs", ANV_CFG_BOOL, "true", 0, 0,
         "decode steps as CUDA graphs (cuda backend; --no-cuda-graphs runs them eagerly)",
         &a.cuda_graphs, false},
        {"json", ANV_CFG_BOOL, "false", 0, 0, "one JSON line per sample", &a.json, false},
        {"tokenize", ANV_CFG_STR, "", 0, 0, "print the ids of TEXT and exit", &a.tokenize, false},
        {"tokenize-jsonl", ANV_CFG_STR, "", 0, 0, "ids and decode of each line of FILE",
         &a.tokenize_jsonl, false},
        {"log-level", ANV_CFG_STR, "info", 0, 0, "error|warn|info|debug", &a.log_level, false},
    };
    size_t n_opts = sizeof(opts) / sizeof(opts[0]);
    anv_cfg_rest_t rest;
    char err[256] = "";
    int rc = 2;
    eng_engine_t *e = NULL;
    if (anv_config_load(opts, n_opts, argc, argv, &rest, err, sizeof(err))) {
        fprintf(stderr, "anvil-generate: %s\n", err);
        anv_config_free(opts, n_opts, &rest);
        return 2;
    }
    if (rest.help || rest.argc) {
        fprintf(rest.help ? stdout : stderr, "usage: anvil-generate --model DIR [options]\n");
        anv_config_usage(opts, n_opts, rest.help ? stdout : stderr);
        rc = rest.help ? 0 : 2;
        goto out;
    }
    int lvl = anv_log_level_parse(a.log_level);
    if (lvl >= 0)
        anv_log_set_level((anv_log_level_t)lvl);
    bool tokenize = a.tokenize[0] || a.tokenize_jsonl[0];
    if (!a.model[0] || (!tokenize && !a.prompt[0] == !a.prompts[0])) {
        fprintf(stderr, "anvil-generate: --model and exactly one of --prompt, --prompts, "
                        "--tokenize, --tokenize-jsonl are needed (--help)\n");
        goto out;
    }
    eng_request_t base = {
        .n = (int)a.n,
        .chat = a.chat,
        .max_tokens = (int)a.max_tokens,
        .sampling = {(float)a.temperature, (int)a.top_k, (float)a.top_p, (float)a.min_p,
                     (int)a.top_logprobs},
        .ignore_eos = a.ignore_eos,
    };
    const char *stops[1] = {a.stop};
    if (a.stop[0]) {
        base.stop = stops;
        base.n_stop = 1;
    }
    int32_t stop_ids[64];
    if (a.stop_ids[0]) {
        int n = 0;
        for (const char *p = a.stop_ids; *p;) {
            char *end;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (errno || end == p || v < 0 || v > INT32_MAX || (*end && *end != ',') || n == 64) {
                fprintf(stderr,
                        "anvil-generate: --stop-ids '%s': want at most 64 comma-separated "
                        "token ids\n",
                        a.stop_ids);
                goto out;
            }
            stop_ids[n++] = (int32_t)v;
            p = *end ? end + 1 : end;
        }
        base.stop_ids = stop_ids;
        base.n_stop_ids = n;
    }
    if (a.seed[0]) {
        char *end;
        errno = 0;
        base.seed = strtoull(a.seed, &end, 0);
        if (errno || *end) {
            fprintf(stderr, "anvil-generate: --seed '%s' is not an integer\n", a.seed);
            goto out;
        }
        base.has_seed = true;
    }
    eng_engine_opts_t eo = {
        .model_dir = a.model,
        .backend = a.backend,
        .n_threads = (int)a.threads,
        .block_size = (int)a.block_size,
        .n_blocks = (int)a.kv_blocks,
        .kv_dtype = a.kv_dtype,
        .max_batch_tokens = (int)a.max_batch_tokens,
        .max_seqs = (int)a.max_seqs,
        .max_context = (int)a.max_context,
        .no_prefix_sharing = a.no_prefix_sharing,
        .cuda_graphs = a.cuda_graphs && !strcmp(a.backend, "cuda"),
    };
    e = eng_engine_new(&eo, err, sizeof(err));
    if (!e) {
        ANV_ERROR("cannot load model '%s': %s", a.model, err);
        rc = 1;
        goto out;
    }
    if (a.tokenize_jsonl[0]) {
        rc = s_tokenize_file(e, a.tokenize_jsonl, a.chat);
    } else if (a.tokenize[0]) {
        eng_ids_t ids = {0};
        int erc = eng_engine_encode_prompt(e, a.tokenize, a.chat, &ids);
        if (erc)
            ANV_ERROR("cannot tokenize: %s", anv_strerror(erc));
        else
            s_print_ids(&ids, NULL, 0, a.json);
        eng_ids_release(&ids);
        rc = erc ? 2 : 0;
    } else {
        rc = s_generate(e, &a, base);
    }
out:
    eng_engine_destroy(&e);
    anv_config_free(opts, n_opts, &rest);
    return rc;
}
