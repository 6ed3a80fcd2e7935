/*  cli_jsonl.c - streaming reader of prompt files (Anvil JSONL and OpenAI Batch JSONL).

    Lines are read into one reusable buffer capped at CLI_JSONL_MAX_LINE: a longer line is
    skipped to its newline and reported, so a hostile file cannot make us allocate without
    bound. Each line is checked to be UTF-8 (protobuf strings must be) and to hold exactly one
    JSON object. Tasks are built on the heap field by field so that protobuf-c's
    free_unpacked() with the default allocator frees them. Duplicate custom_ids are found with
    an open-addressing table of (64-bit FNV-1a hash, line) pairs: 16 bytes an id, whatever the
    ids' length, and the first line is named in the error.
*/
#include "cli_jsonl.h"

#include "anv_error.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    uint64_t hash; /* 0 = empty slot (a real hash of 0 is stored as 1) */
    uint64_t line;
} s_slot_t;

struct cli_jsonl_t {
    FILE *f;
    char *path;
    struct stat st; /* at open: rewind refuses a file that changed */
    char *buf;
    size_t cap;
    uint64_t line;
    cli_fmt_t fmt;
    s_slot_t *ids;
    size_t ids_cap, ids_n;
    char errstr[512];
};

/* ---------------------------------------------------------------------------------------- */
/* errors */

#define S_FAIL(...)                                                                                \
    do {                                                                                           \
        snprintf(err, errlen, __VA_ARGS__);                                                        \
        goto fail;                                                                                 \
    } while (0)

static char *s_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

/* ---------------------------------------------------------------------------------------- */
/* value checks */

static bool s_utf8_valid(const unsigned char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        unsigned char c = s[i];
        size_t n;
        uint32_t cp;
        if (c < 0x80) {
            if (c == 0)
                return false;
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            n = 1;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            n = 2;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            n = 3;
            cp = c & 0x07;
        } else {
            return false;
        }
        for (size_t k = 1; k <= n; k++) {
            if (i + k >= len || (s[i + k] & 0xC0) != 0x80)
                return false;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        /* overlong forms, surrogates and values past U+10FFFF */
        if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
            (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
            return false;
        i += n + 1;
    }
    return true;
}

static int s_get_number(const cJSON *o, const char *key, double lo, double hi, bool integer,
                        bool *has, double *out, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *has = false;
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo ||
        v->valuedouble > hi || (integer && v->valuedouble != floor(v->valuedouble))) {
        snprintf(err, errlen, "'%s' must be %s in [%.15g, %.15g]", key, integer ? "an integer" : "a number",
                 lo, hi);
        return ANV_EFORMAT;
    }
    *has = true;
    *out = v->valuedouble;
    return 0;
}

static int s_get_string(const cJSON *o, const char *key, bool required, const char **out, char *err,
                        size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = NULL;
    if (!v || cJSON_IsNull(v)) {
        if (required) {
            snprintf(err, errlen, "missing '%s'", key);
            return ANV_EFORMAT;
        }
        return 0;
    }
    if (!cJSON_IsString(v) || !v->valuestring) {
        snprintf(err, errlen, "'%s' must be a string", key);
        return ANV_EFORMAT;
    }
    *out = v->valuestring;
    return 0;
}

/* Fails on a key of `o` that is not in the NULL-terminated list. */
static int s_check_keys(const cJSON *o, const char *where, const char *const *known, char *err,
                        size_t errlen)
{
    for (const cJSON *it = o->child; it; it = it->next) {
        bool ok = false;
        for (const char *const *k = known; *k && !ok; k++)
            ok = it->string && !strcmp(it->string, *k);
        if (!ok) {
            snprintf(err, errlen, "unknown field '%s%s'", where, it->string ? it->string : "");
            return ANV_EFORMAT;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* building a task */

static int s_parse_stop(const cJSON *o, Anvil__SamplingParams *sp, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "stop");
    if (!v || cJSON_IsNull(v))
        return 0;
    int n = cJSON_IsString(v) ? 1 : cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (n < 0 || n > 16) {
        snprintf(err, errlen, "'stop' must be a string or a list of at most 16 strings");
        return ANV_EFORMAT;
    }
    if (n == 0)
        return 0;
    sp->stop = calloc((size_t)n, sizeof(char *));
    if (!sp->stop)
        return -ENOMEM;
    const cJSON *it = cJSON_IsString(v) ? v : v->child;
    for (int i = 0; i < n; i++, it = it->next) {
        if (!cJSON_IsString(it) || !it->valuestring[0] || strlen(it->valuestring) > 1024) {
            snprintf(err, errlen, "'stop' entries must be non-empty strings of at most 1024 bytes");
            return ANV_EFORMAT;
        }
        if (!(sp->stop[i] = s_strdup(it->valuestring)))
            return -ENOMEM;
        sp->n_stop = (size_t)i + 1;
    }
    return 0;
}

static int s_parse_stop_ids(const cJSON *o, Anvil__SamplingParams *sp, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "stop_token_ids");
    if (!v || cJSON_IsNull(v))
        return 0;
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (n < 0 || n > 64) {
        snprintf(err, errlen, "'stop_token_ids' must be a list of at most 64 token ids");
        return ANV_EFORMAT;
    }
    if (n == 0)
        return 0;
    if (!(sp->stop_token_ids = calloc((size_t)n, sizeof(uint32_t))))
        return -ENOMEM;
    const cJSON *it = v->child;
    for (int i = 0; i < n; i++, it = it->next) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > 4294967295.0 ||
            it->valuedouble != floor(it->valuedouble)) {
            snprintf(err, errlen, "'stop_token_ids' entries must be integers in [0, 2^32)");
            return ANV_EFORMAT;
        }
        sp->stop_token_ids[i] = (uint32_t)it->valuedouble;
        sp->n_stop_token_ids = (size_t)i + 1;
    }
    return 0;
}

/* Sampling overrides from `o` (a line or an OpenAI body). `max_key` names the max-tokens key;
   `alt_max_key`, when not NULL, is accepted too. Leaves task->sampling NULL when none is set. */
static int s_parse_sampling(const cJSON *o, const char *max_key, const char *alt_max_key,
                            Anvil__Task *task, char *err, size_t errlen)
{
    Anvil__SamplingParams *sp = malloc(sizeof *sp);
    if (!sp)
        return -ENOMEM;
    anvil__sampling_params__init(sp);
    task->sampling = sp;
    bool has, any = false;
    double d;
    int rc;
    if ((rc = s_get_number(o, "temperature", 0, 10, false, &has, &d, err, errlen)))
        return rc;
    if (has)
        sp->has_temperature = any = true, sp->temperature = (float)d;
    if ((rc = s_get_number(o, "top_p", 0, 1, false, &has, &d, err, errlen)))
        return rc;
    if (has && d <= 0) {
        snprintf(err, errlen, "'top_p' must be in (0, 1]");
        return ANV_EFORMAT;
    }
    if (has)
        sp->has_top_p = any = true, sp->top_p = (float)d;
    if ((rc = s_get_number(o, "top_k", 0, 1e6, true, &has, &d, err, errlen)))
        return rc;
    if (has)
        sp->has_top_k = any = true, sp->top_k = (int32_t)d;
    if ((rc = s_get_number(o, "min_p", 0, 1, false, &has, &d, err, errlen)))
        return rc;
    if (has)
        sp->has_min_p = any = true, sp->min_p = (float)d;
    if ((rc = s_get_number(o, max_key, 1, 1 << 20, true, &has, &d, err, errlen)))
        return rc;
    if (!has && alt_max_key &&
        (rc = s_get_number(o, alt_max_key, 1, 1 << 20, true, &has, &d, err, errlen)))
        return rc;
    if (has)
        sp->has_max_tokens = any = true, sp->max_tokens = (uint32_t)d;
    /* 2^53: a JSON number above it is not an exact integer any more */
    if ((rc = s_get_number(o, "seed", 0, 9007199254740992.0, true, &has, &d, err, errlen)))
        return rc;
    if (has)
        sp->has_seed = any = true, sp->seed = (uint64_t)d;
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(o, "logprobs");
    if (lp && !cJSON_IsNull(lp)) {
        if (!cJSON_IsBool(lp)) {
            snprintf(err, errlen, "'logprobs' must be true or false");
            return ANV_EFORMAT;
        }
        sp->has_logprobs = any = true;
        sp->logprobs = cJSON_IsTrue(lp);
    }
    if ((rc = s_get_number(o, "top_logprobs", 0, 20, true, &has, &d, err, errlen)))
        return rc;
    if (has)
        sp->has_top_logprobs = any = true, sp->top_logprobs = (uint32_t)d;
    if ((rc = s_parse_stop(o, sp, err, errlen)) || (rc = s_parse_stop_ids(o, sp, err, errlen)))
        return rc;
    any = any || sp->n_stop || sp->n_stop_token_ids;
    if ((rc = s_get_number(o, "n", 1, 4096, true, &has, &d, err, errlen)))
        return rc;
    if (has)
        task->has_n = true, task->n = (uint32_t)d;
    if (!any) {
        anvil__sampling_params__free_unpacked(sp, NULL);
        task->sampling = NULL;
    }
    return 0;
}

/* OpenAI content: a string, or a list of {"type": "text", "text": ...} parts (concatenated). */
static int s_content_text(const cJSON *c, char **out, char *err, size_t errlen)
{
    if (cJSON_IsString(c))
        return (*out = s_strdup(c->valuestring)) ? 0 : -ENOMEM;
    if (!cJSON_IsArray(c)) {
        snprintf(err, errlen, "message 'content' must be a string or a list of text parts");
        return ANV_EFORMAT;
    }
    size_t len = 0;
    for (const cJSON *p = c->child; p; p = p->next) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsObject(p) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") ||
            !cJSON_IsString(text)) {
            snprintf(err, errlen, "only text content parts ({\"type\": \"text\", \"text\": ...}) "
                                  "are supported");
            return ANV_EFORMAT;
        }
        len += strlen(text->valuestring);
    }
    if (!(*out = malloc(len + 1)))
        return -ENOMEM;
    size_t k = 0;
    for (const cJSON *p = c->child; p; p = p->next) {
        const char *t = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        size_t n = strlen(t);
        memcpy(*out + k, t, n);
        k += n;
    }
    (*out)[k] = 0;
    return 0;
}

static int s_parse_messages(const cJSON *v, Anvil__Task *task, char *err, size_t errlen)
{
    static const char *const roles[] = {"system", "user", "assistant", "developer", "tool", NULL};
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (n <= 0) {
        snprintf(err, errlen, "'messages' must be a non-empty list");
        return ANV_EFORMAT;
    }
    if (!(task->messages = calloc((size_t)n, sizeof *task->messages)))
        return -ENOMEM;
    int i = 0;
    for (const cJSON *m = v->child; m; m = m->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        bool known = false;
        if (cJSON_IsString(role))
            for (const char *const *r = roles; *r && !known; r++)
                known = !strcmp(role->valuestring, *r);
        if (!cJSON_IsObject(m) || !known) {
            snprintf(err, errlen, "messages[%d] needs a 'role' of system, user, assistant, "
                                  "developer or tool", i);
            return ANV_EFORMAT;
        }
        if (!content) {
            snprintf(err, errlen, "messages[%d] has no 'content'", i);
            return ANV_EFORMAT;
        }
        Anvil__ChatMessage *cm = malloc(sizeof *cm);
        if (!cm)
            return -ENOMEM;
        anvil__chat_message__init(cm);
        task->messages[i] = cm;
        task->n_messages = (size_t)i + 1;
        if (!(cm->role = s_strdup(role->valuestring)))
            return -ENOMEM;
        char e2[200];
        int rc = s_content_text(content, &cm->content, e2, sizeof e2);
        if (rc == ANV_EFORMAT)
            snprintf(err, errlen, "messages[%d]: %s", i, e2);
        if (rc)
            return rc;
    }
    return 0;
}

static int s_kind_parse(const char *s, Anvil__TaskKind *kind)
{
    static const struct {
        const char *name;
        Anvil__TaskKind kind;
    } kinds[] = {{"none", ANVIL__TASK_KIND__TASK_KIND_NONE},
                 {"kernelbench", ANVIL__TASK_KIND__TASK_KIND_KERNELBENCH},
                 {"tritonbench-g", ANVIL__TASK_KIND__TASK_KIND_TRITONBENCH_G},
                 {"tritonbench_g", ANVIL__TASK_KIND__TASK_KIND_TRITONBENCH_G},
                 {"tritonbench-t", ANVIL__TASK_KIND__TASK_KIND_TRITONBENCH_T},
                 {"tritonbench_t", ANVIL__TASK_KIND__TASK_KIND_TRITONBENCH_T}};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (!strcmp(s, kinds[i].name)) {
            *kind = kinds[i].kind;
            return 0;
        }
    return ANV_EFORMAT;
}

static int s_parse_task_ref(const cJSON *v, Anvil__Task *task, char *err, size_t errlen)
{
    static const char *const keys[] = {"kind", "name", "reference_code", "test_code", "extra",
                                       NULL};
    if (!cJSON_IsObject(v)) {
        snprintf(err, errlen, "'task' must be an object");
        return ANV_EFORMAT;
    }
    int rc = s_check_keys(v, "task.", keys, err, errlen);
    if (rc)
        return rc;
    const char *kind, *name, *ref, *test;
    if ((rc = s_get_string(v, "kind", true, &kind, err, errlen)) ||
        (rc = s_get_string(v, "name", false, &name, err, errlen)) ||
        (rc = s_get_string(v, "reference_code", false, &ref, err, errlen)) ||
        (rc = s_get_string(v, "test_code", false, &test, err, errlen))) {
        /* name the field inside task */
        char tmp[256];
        snprintf(tmp, sizeof tmp, "task: %s", err);
        snprintf(err, errlen, "%s", tmp);
        return rc;
    }
    Anvil__TaskRef *r = malloc(sizeof *r);
    if (!r)
        return -ENOMEM;
    anvil__task_ref__init(r);
    task->ref = r;
    if (s_kind_parse(kind, &r->kind)) {
        snprintf(err, errlen, "task.kind '%.40s' is not one of none, kernelbench, tritonbench-g, "
                              "tritonbench-t", kind);
        return ANV_EFORMAT;
    }
    r->has_kind = true;
    if (r->kind != ANVIL__TASK_KIND__TASK_KIND_NONE && (!ref || !*ref)) {
        snprintf(err, errlen, "task.kind '%s' needs a non-empty 'reference_code'", kind);
        return ANV_EFORMAT;
    }
    if ((r->kind == ANVIL__TASK_KIND__TASK_KIND_TRITONBENCH_G ||
         r->kind == ANVIL__TASK_KIND__TASK_KIND_TRITONBENCH_T) &&
        (!test || !*test)) {
        snprintf(err, errlen, "task.kind '%s' needs a non-empty 'test_code'", kind);
        return ANV_EFORMAT;
    }
    if ((name && !(r->name = s_strdup(name))) || (ref && !(r->reference_code = s_strdup(ref))) ||
        (test && !(r->test_code = s_strdup(test))))
        return -ENOMEM;
    const cJSON *extra = cJSON_GetObjectItemCaseSensitive(v, "extra");
    if (extra && !cJSON_IsNull(extra) && !(r->extra_json = cJSON_PrintUnformatted(extra)))
        return -ENOMEM;
    return 0;
}

static int s_set_custom_id(const cJSON *o, bool required, uint64_t line, Anvil__Task *task,
                           char *err, size_t errlen)
{
    const char *id;
    int rc = s_get_string(o, "custom_id", required, &id, err, errlen);
    if (rc)
        return rc;
    if (id && (!*id || strlen(id) > 512)) {
        snprintf(err, errlen, "'custom_id' must be 1 to 512 bytes");
        return ANV_EFORMAT;
    }
    char dflt[32];
    if (!id) {
        snprintf(dflt, sizeof dflt, "line-%llu", (unsigned long long)line);
        id = dflt;
    }
    return (task->custom_id = s_strdup(id)) ? 0 : -ENOMEM;
}

/* "completion": a string, or "completions": a list of 1 to 4096 strings (score-only jobs) */
static int s_parse_completions(const cJSON *o, Anvil__Task *task, char *err, size_t errlen)
{
    const cJSON *one = cJSON_GetObjectItemCaseSensitive(o, "completion");
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, "completions");
    if (one && list) {
        snprintf(err, errlen, "give either 'completion' or 'completions', not both");
        return ANV_EFORMAT;
    }
    if (!one && !list)
        return 0;
    if (one && !cJSON_IsString(one)) {
        snprintf(err, errlen, "'completion' must be a string");
        return ANV_EFORMAT;
    }
    int n = one ? 1 : cJSON_IsArray(list) ? cJSON_GetArraySize(list) : -1;
    if (n <= 0 || n > 4096) {
        snprintf(err, errlen, "'completions' must be a list of 1 to 4096 strings");
        return ANV_EFORMAT;
    }
    if (!(task->completions = calloc((size_t)n, sizeof *task->completions)))
        return -ENOMEM;
    const cJSON *c = one ? one : list->child;
    for (int i = 0; i < n; i++, c = c->next) {
        if (!cJSON_IsString(c)) {
            snprintf(err, errlen, "completions[%d] must be a string", i);
            return ANV_EFORMAT;
        }
        if (!(task->completions[i] = s_strdup(c->valuestring)))
            return -ENOMEM;
        task->n_completions = (size_t)i + 1;
    }
    return 0;
}

static int s_parse_anvil(const cJSON *o, uint64_t line, Anvil__Task *task, char *err, size_t errlen)
{
    static const char *const keys[] = {
        "custom_id", "prompt", "messages",      "task",         "n",        "temperature",
        "top_p",     "top_k",  "min_p",         "max_tokens",   "stop",     "stop_token_ids",
        "seed",      "logprobs", "top_logprobs", "metadata",    "completion", "completions",
        NULL};
    int rc;
    if ((rc = s_check_keys(o, "", keys, err, errlen)) ||
        (rc = s_set_custom_id(o, false, line, task, err, errlen)) ||
        (rc = s_parse_completions(o, task, err, errlen)))
        return rc;
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages");
    if (prompt && msgs) {
        snprintf(err, errlen, "give either 'prompt' or 'messages', not both");
        return ANV_EFORMAT;
    }
    if (!prompt && !msgs && !task->n_completions) {
        snprintf(err, errlen, "missing 'prompt' or 'messages'");
        return ANV_EFORMAT;
    }
    if (prompt) {
        if (!cJSON_IsString(prompt) || !prompt->valuestring[0]) {
            snprintf(err, errlen, "'prompt' must be a non-empty string");
            return ANV_EFORMAT;
        }
        if (!(task->prompt = s_strdup(prompt->valuestring)))
            return -ENOMEM;
    } else if (msgs && (rc = s_parse_messages(msgs, task, err, errlen))) {
        return rc;
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(o, "task");
    if (ref && !cJSON_IsNull(ref) && (rc = s_parse_task_ref(ref, task, err, errlen)))
        return rc;
    if ((rc = s_parse_sampling(o, "max_tokens", NULL, task, err, errlen)))
        return rc;
    if (task->n_completions && task->has_n && task->n != task->n_completions) {
        snprintf(err, errlen, "'n' is %u but the line has %zu completion(s)", task->n,
                 task->n_completions);
        return ANV_EFORMAT;
    }
    return 0;
}

/* Body keys we accept but do not act on, when they hold their neutral value. */
static int s_openai_ignored(const cJSON *body, char *err, size_t errlen)
{
    static const char *const zero[] = {"frequency_penalty", "presence_penalty", NULL};
    for (const char *const *k = zero; *k; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, *k);
        if (v && !cJSON_IsNull(v) && (!cJSON_IsNumber(v) || v->valuedouble != 0)) {
            snprintf(err, errlen, "body.%s is not supported (only 0)", *k);
            return ANV_EFORMAT;
        }
    }
    const cJSON *stream = cJSON_GetObjectItemCaseSensitive(body, "stream");
    if (stream && !cJSON_IsNull(stream) && !cJSON_IsFalse(stream)) {
        snprintf(err, errlen, "body.stream is not supported in a batch (only false)");
        return ANV_EFORMAT;
    }
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(body, "logit_bias");
    if (bias && !cJSON_IsNull(bias) && (!cJSON_IsObject(bias) || bias->child)) {
        snprintf(err, errlen, "body.logit_bias is not supported (only {})");
        return ANV_EFORMAT;
    }
    return 0;
}

static int s_parse_openai(const cJSON *o, uint64_t line, Anvil__Task *task, char *err,
                          size_t errlen)
{
    static const char *const keys[] = {"custom_id", "method", "url", "body", "task", NULL};
    static const char *const body_keys[] = {
        "model",          "messages",  "prompt",      "max_tokens",   "max_completion_tokens",
        "temperature",    "top_p",     "top_k",       "min_p",        "n",
        "stop",           "seed",      "logprobs",    "top_logprobs", "user",
        "metadata",       "store",     "stream",      "frequency_penalty",
        "presence_penalty", "logit_bias", NULL};
    int rc;
    const char *method, *url;
    if ((rc = s_check_keys(o, "", keys, err, errlen)) ||
        (rc = s_set_custom_id(o, true, line, task, err, errlen)) ||
        (rc = s_get_string(o, "method", false, &method, err, errlen)) ||
        (rc = s_get_string(o, "url", false, &url, err, errlen)))
        return rc;
    if (method && strcmp(method, "POST")) {
        snprintf(err, errlen, "'method' must be \"POST\"");
        return ANV_EFORMAT;
    }
    bool completions = url && !strcmp(url, "/v1/completions");
    if (url && !completions && strcmp(url, "/v1/chat/completions")) {
        snprintf(err, errlen, "'url' must be /v1/chat/completions or /v1/completions");
        return ANV_EFORMAT;
    }
    const cJSON *body = cJSON_GetObjectItemCaseSensitive(o, "body");
    if (!cJSON_IsObject(body)) {
        snprintf(err, errlen, "'body' must be an object");
        return ANV_EFORMAT;
    }
    if ((rc = s_check_keys(body, "body.", body_keys, err, errlen)) ||
        (rc = s_openai_ignored(body, err, errlen)))
        return rc;
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(body, "messages");
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(body, "prompt");
    if (completions) {
        if (!cJSON_IsString(prompt) || !prompt->valuestring[0] || msgs) {
            snprintf(err, errlen, "/v1/completions needs a non-empty string body.prompt and no "
                                  "body.messages");
            return ANV_EFORMAT;
        }
        if (!(task->prompt = s_strdup(prompt->valuestring)))
            return -ENOMEM;
    } else {
        if (prompt) {
            snprintf(err, errlen, "body.prompt belongs to /v1/completions; chat uses "
                                  "body.messages");
            return ANV_EFORMAT;
        }
        if (!msgs) {
            snprintf(err, errlen, "missing body.messages");
            return ANV_EFORMAT;
        }
        char e2[256];
        if ((rc = s_parse_messages(msgs, task, e2, sizeof e2))) {
            snprintf(err, errlen, "body.%s", e2);
            return rc;
        }
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(o, "task");
    if (ref && !cJSON_IsNull(ref) && (rc = s_parse_task_ref(ref, task, err, errlen)))
        return rc;
    char e2[256];
    if ((rc = s_parse_sampling(body, "max_tokens", "max_completion_tokens", task, e2, sizeof e2))) {
        snprintf(err, errlen, "body.%s", e2);
        return rc;
    }
    return 0;
}

static int s_parse(const char *line, size_t len, uint64_t lineno, cli_fmt_t *fmt,
                   Anvil__Task **out, char *err, size_t errlen)
{
    int rc = ANV_EFORMAT;
    cJSON *o = NULL;
    Anvil__Task *task = NULL;
    *out = NULL;
    if (!s_utf8_valid((const unsigned char *)line, len))
        S_FAIL("not valid UTF-8 text (or contains a NUL byte)");
    const char *end = NULL;
    o = cJSON_ParseWithLengthOpts(line, len, &end, false);
    if (!o) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= line && at <= line + len ? (size_t)(at - line) : 0;
        S_FAIL("not valid JSON (at byte %zu)", off + 1);
    }
    for (; end && end < line + len; end++)
        if (*end != ' ' && *end != '\t' && *end != '\r' && *end != '\n')
            S_FAIL("more than one JSON value on the line");
    if (!cJSON_IsObject(o))
        S_FAIL("a line must be a JSON object");
    cli_fmt_t mine = cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(o, "body")) ? CLI_FMT_OPENAI
                                                                                  : CLI_FMT_ANVIL;
    if (*fmt == CLI_FMT_UNKNOWN)
        *fmt = mine;
    if (mine != *fmt)
        S_FAIL("an %s line in a file detected as %s (from its first line); one format per file",
               cli_jsonl_format_name(mine), cli_jsonl_format_name(*fmt));
    if (!(task = malloc(sizeof *task))) {
        rc = -ENOMEM;
        S_FAIL("out of memory");
    }
    anvil__task__init(task);
    rc = mine == CLI_FMT_OPENAI ? s_parse_openai(o, lineno, task, err, errlen)
                                : s_parse_anvil(o, lineno, task, err, errlen);
    if (rc == -ENOMEM)
        snprintf(err, errlen, "out of memory");
    if (rc)
        goto fail;
    cJSON_Delete(o);
    *out = task;
    return 0;
fail:
    cJSON_Delete(o);
    cli_task_free(&task);
    return rc;
}

int cli_jsonl_parse_line(const char *line, size_t len, cli_fmt_t *fmt, Anvil__Task **task,
                         char *err, size_t errlen)
{
    cli_fmt_t f = fmt ? *fmt : CLI_FMT_UNKNOWN;
    int rc = s_parse(line, len, 1, &f, task, err, errlen);
    if (fmt)
        *fmt = f;
    return rc;
}

void cli_task_free(Anvil__Task **task_p)
{
    if (task_p && *task_p) {
        anvil__task__free_unpacked(*task_p, NULL);
        *task_p = NULL;
    }
}

const char *cli_jsonl_format_name(cli_fmt_t fmt)
{
    return fmt == CLI_FMT_OPENAI ? "OpenAI Batch" : fmt == CLI_FMT_ANVIL ? "Anvil" : "unknown";
}

/* ---------------------------------------------------------------------------------------- */
/* duplicate ids */

static uint64_t s_fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h ? h : 1;
}

/* Returns 0 when new (and records it), or the line that had it first. -ENOMEM on failure. */
static int64_t s_ids_add(cli_jsonl_t *self, const char *id, uint64_t line)
{
    if (self->ids_n * 2 >= self->ids_cap) {
        size_t cap = self->ids_cap ? self->ids_cap * 2 : 1024;
        s_slot_t *t = calloc(cap, sizeof *t);
        if (!t)
            return -ENOMEM;
        for (size_t i = 0; i < self->ids_cap; i++) {
            if (!self->ids[i].hash)
                continue;
            size_t j = self->ids[i].hash & (cap - 1);
            while (t[j].hash)
                j = (j + 1) & (cap - 1);
            t[j] = self->ids[i];
        }
        free(self->ids);
        self->ids = t;
        self->ids_cap = cap;
    }
    uint64_t h = s_fnv1a(id);
    size_t j = h & (self->ids_cap - 1);
    for (; self->ids[j].hash; j = (j + 1) & (self->ids_cap - 1))
        if (self->ids[j].hash == h)
            return (int64_t)self->ids[j].line;
    self->ids[j].hash = h;
    self->ids[j].line = line;
    self->ids_n++;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* the reader */

cli_jsonl_t *cli_jsonl_open(const char *path, char *err, size_t errlen)
{
    cli_jsonl_t *self = calloc(1, sizeof *self);
    if (!self) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (!(self->path = s_strdup(path)))
        goto nomem;
    if (!strcmp(path, "-")) {
        /* spool stdin so that the second pass can read it again */
        if (!(self->f = tmpfile())) {
            snprintf(err, errlen, "cannot create a temporary file for standard input: %s",
                     strerror(errno));
            goto fail;
        }
        char chunk[65536];
        size_t n;
        while ((n = fread(chunk, 1, sizeof chunk, stdin)) > 0)
            if (fwrite(chunk, 1, n, self->f) != n) {
                snprintf(err, errlen, "cannot spool standard input: %s", strerror(errno));
                goto fail;
            }
        if (ferror(stdin) || fflush(self->f) || fseek(self->f, 0, SEEK_SET)) {
            snprintf(err, errlen, "cannot read standard input: %s", strerror(errno));
            goto fail;
        }
    } else if (!(self->f = fopen(path, "rb"))) {
        snprintf(err, errlen, "cannot open '%s': %s", path, strerror(errno));
        goto fail;
    }
    if (fstat(fileno(self->f), &self->st) < 0) {
        snprintf(err, errlen, "cannot stat '%s': %s", path, strerror(errno));
        goto fail;
    }
    if (S_ISDIR(self->st.st_mode)) {
        snprintf(err, errlen, "'%s' is a directory", path);
        goto fail;
    }
    return self;
nomem:
    snprintf(err, errlen, "out of memory");
fail:
    cli_jsonl_destroy(&self);
    return NULL;
}

void cli_jsonl_destroy(cli_jsonl_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    cli_jsonl_t *self = *self_p;
    if (self->f)
        fclose(self->f);
    free(self->path);
    free(self->buf);
    free(self->ids);
    free(self);
    *self_p = NULL;
}

/* Reads one line into self->buf without its newline. Returns 1, 0 at EOF, ANV_ETOOBIG for a
   line past the cap (skipped), or -errno. */
static int s_read_line(cli_jsonl_t *self, size_t *len)
{
    size_t n = 0;
    bool over = false;
    int c;
    *len = 0;
    if (!self->buf) { /* an empty first line needs room for its terminator too (it wrote to
                         NULL: `anvil submit` crashed on a file starting with a blank line) */
        if (!(self->buf = malloc(4096)))
            return -ENOMEM;
        self->cap = 4096;
    }
    while ((c = getc_unlocked(self->f)) != EOF && c != '\n') {
        if (over)
            continue;
        if (n + 1 >= self->cap) {
            if (self->cap >= CLI_JSONL_MAX_LINE + 1) {
                over = true;
                continue;
            }
            size_t cap = self->cap ? self->cap * 2 : 4096;
            if (cap > CLI_JSONL_MAX_LINE + 1)
                cap = CLI_JSONL_MAX_LINE + 1;
            char *b = realloc(self->buf, cap);
            if (!b)
                return -ENOMEM;
            self->buf = b;
            self->cap = cap;
        }
        self->buf[n++] = (char)c;
    }
    if (ferror(self->f))
        return -(errno ? errno : EIO);
    if (c == EOF && n == 0 && !over)
        return 0;
    self->line++;
    if (over)
        return ANV_ETOOBIG;
    self->buf[n] = 0;
    *len = n;
    return 1;
}

static bool s_blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return false;
    return true;
}

int cli_jsonl_next(cli_jsonl_t *self, Anvil__Task **task)
{
    *task = NULL;
    for (;;) {
        size_t len;
        int rc = s_read_line(self, &len);
        if (rc == 0)
            return 0;
        if (rc == ANV_ETOOBIG) {
            snprintf(self->errstr, sizeof self->errstr, "line %llu: longer than %u MiB",
                     (unsigned long long)self->line, CLI_JSONL_MAX_LINE >> 20);
            return ANV_EFORMAT;
        }
        if (rc < 0) {
            snprintf(self->errstr, sizeof self->errstr, "cannot read '%s' after line %llu: %s",
                     self->path, (unsigned long long)self->line, strerror(-rc));
            return rc;
        }
        if (s_blank(self->buf, len))
            continue;
        char err[400];
        rc = s_parse(self->buf, len, self->line, &self->fmt, task, err, sizeof err);
        if (rc) {
            snprintf(self->errstr, sizeof self->errstr, "line %llu: %s",
                     (unsigned long long)self->line, err);
            return rc == -ENOMEM ? rc : ANV_EFORMAT;
        }
        int64_t first = s_ids_add(self, (*task)->custom_id, self->line);
        if (first < 0) {
            cli_task_free(task);
            snprintf(self->errstr, sizeof self->errstr, "out of memory");
            return -ENOMEM;
        }
        if (first > 0) {
            snprintf(self->errstr, sizeof self->errstr,
                     "line %llu: duplicate custom_id '%.200s' (first on line %lld)",
                     (unsigned long long)self->line, (*task)->custom_id, (long long)first);
            cli_task_free(task);
            return ANV_EFORMAT;
        }
        return 1;
    }
}

int cli_jsonl_rewind(cli_jsonl_t *self)
{
    struct stat st;
    if (fstat(fileno(self->f), &st) < 0 || st.st_size != self->st.st_size ||
        st.st_mtim.tv_sec != self->st.st_mtim.tv_sec ||
        st.st_mtim.tv_nsec != self->st.st_mtim.tv_nsec) {
        snprintf(self->errstr, sizeof self->errstr, "'%s' changed while it was being read",
                 self->path);
        return ANV_ESTATE;
    }
    if (fseek(self->f, 0, SEEK_SET) < 0) {
        snprintf(self->errstr, sizeof self->errstr, "cannot rewind '%s': %s", self->path,
                 strerror(errno));
        return -errno;
    }
    clearerr(self->f);
    self->line = 0;
    self->fmt = CLI_FMT_UNKNOWN;
    /* the duplicate table is made by the first task: a file without one has none to clear
       (memset of NULL is undefined even for 0 bytes) */
    if (self->ids)
        memset(self->ids, 0, self->ids_cap * sizeof *self->ids);
    self->ids_n = 0;
    return 0;
}

cli_fmt_t cli_jsonl_format(const cli_jsonl_t *self)
{
    return self->fmt;
}

uint64_t cli_jsonl_line(const cli_jsonl_t *self)
{
    return self->line;
}

const char *cli_jsonl_errstr(const cli_jsonl_t *self)
{
    return self->errstr;
}
