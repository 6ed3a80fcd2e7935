/*  eng_tokenizer.c - byte-level BPE from a Hugging Face tokenizer.json.

    Tables built at load: vocab (token string -> id), every id's string and decoded bytes, the
    merge table keyed by the pair of ids (value: rank; merge_into[rank] is the merged id), the
    vocab id of each of the 256 byte characters, the added tokens bucketed by first byte and
    sorted longest first (leftmost-longest matching), and the compiled pre-tokenizer steps.

    Pre-tokenization is a list of pieces in an arena; each step maps every piece to sub-pieces
    (Split, Digits, ByteLevel's optional prefix space and GPT-2 split), exactly the sequence HF
    applies. BPE on a piece keeps the rank of each adjacent pair in an array and repeatedly
    merges the leftmost pair of lowest rank, which is what HF's priority queue computes.
*/
#define _GNU_SOURCE           /* qsort_r */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "eng_tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "anv_error.h"
#include "anv_log.h"
#include "eng_config.h"

#define S_MAX_STEPS 16
#define S_GPT2_PATTERN                                                                             \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

typedef enum { S_STEP_SPLIT, S_STEP_BYTELEVEL } s_step_kind_t;

typedef struct {
    s_step_kind_t kind;
    pcre2_code *re;        /* split pattern (NULL: ByteLevel without use_regex) */
    bool removed;          /* Split behaviour Removed instead of Isolated */
    bool add_prefix_space; /* ByteLevel */
} s_step_t;

typedef struct {
    int32_t id;
    char *content;
    size_t len;
    bool special, lstrip, rstrip;
} s_added_t;

struct eng_tokenizer {
    int n_ids;
    char **tok_str;       /* (n_ids) token string as in the file, NULL for holes */
    eng_buf_t *tok_bytes; /* (n_ids) decoded bytes */
    bool *is_special;     /* (n_ids) */
    eng_strmap_t *vocab;  /* token string -> id (model vocab and added tokens) */
    eng_strmap_t *merges; /* (id_a, id_b) as 8 bytes -> rank */
    int32_t *merge_into;  /* (n_merges) */
    int n_merges;
    bool ignore_merges;
    int32_t byte_id[256];   /* vocab id of each byte's character, -1 if absent */
    char byte_char[256][3]; /* the UTF-8 of each byte's character */
    int byte_char_len[256];
    s_added_t *added;
    int n_added;
    int *bucket[256]; /* indices into added, longest first */
    int bucket_n[256];
    s_step_t steps[S_MAX_STEPS];
    int n_steps;
    int32_t bos, eos;
    bool add_bos;
    char *chat_template;
};

/* --- byte <-> unicode (GPT-2) ------------------------------------------------------------ */

static void s_byte_map(int cp_of_byte[256])
{
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        cp_of_byte[b] = keep ? b : 256 + n++;
    }
}

static int s_utf8_put(char *out, int cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xc0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2; /* the map's code points are all below 0x800 */
}

/* Decodes one UTF-8 code point at s (n bytes left); returns its length or 0 when invalid. */
static int s_utf8_get(const unsigned char *s, size_t n, int *cp)
{
    int len = s[0] < 0x80         ? 1
              : (s[0] >> 5) == 6  ? 2
              : (s[0] >> 4) == 14 ? 3
              : (s[0] >> 3) == 30 ? 4
                                  : 0;
    if (!len || (size_t)len > n)
        return 0;
    int c = len == 1 ? s[0] : s[0] & (0x7f >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        c = (c << 6) | (s[i] & 0x3f);
    }
    *cp = c;
    return len;
}

size_t eng_utf8_complete_prefix(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    /* look back at most 3 bytes for a lead byte whose sequence runs past the end */
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = s[n - back];
        if ((c & 0xc0) == 0x80)
            continue; /* continuation byte: keep looking for its lead */
        size_t need = c >= 0xf0 && c <= 0xf4  ? 4
                      : c >= 0xe0 && c < 0xf0 ? 3
                      : c >= 0xc2 && c < 0xe0 ? 2
                                              : 1;
        return need > back ? n - back : n;
    }
    return n;
}

/* --- loading ----------------------------------------------------------------------------- */

static pcre2_code *s_compile(const char *pattern, size_t len, char *err, size_t errlen)
{
    int ec;
    PCRE2_SIZE off;
    pcre2_code *re =
        pcre2_compile((PCRE2_SPTR)pattern, len, PCRE2_UTF | PCRE2_UCP, &ec, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof(msg));
        snprintf(err, errlen, "tokenizer.json: pre-tokenizer regex does not compile at %zu: %s",
                 (size_t)off, (char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional: falls back to the interpreter */
    return re;
}

/* Escapes a literal String pattern into a regex. */
static char *s_quote(const char *lit)
{
    size_t n = strlen(lit);
    char *out = malloc(n + 5);
    if (out)
        snprintf(out, n + 5, "\\Q%s\\E", lit);
    return out;
}

static int s_add_step(eng_tokenizer_t *self, const cJSON *pt, char *err, size_t errlen)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pt, "type");
    if (!cJSON_IsString(type)) {
        snprintf(err, errlen, "tokenizer.json: pre-tokenizer without a type");
        return ANV_EFORMAT;
    }
    if (strcmp(type->valuestring, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers"), *e;
        cJSON_ArrayForEach(e, list)
        {
            int rc = s_add_step(self, e, err, errlen);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (self->n_steps == S_MAX_STEPS) {
        snprintf(err, errlen, "tokenizer.json: more than %d pre-tokenizers", S_MAX_STEPS);
        return ANV_EUNSUPPORTED;
    }
    s_step_t *st = &self->steps[self->n_steps];
    memset(st, 0, sizeof(*st));
    if (strcmp(type->valuestring, "Split") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(pt, "pattern");
        const cJSON *rx = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *lit = cJSON_GetObjectItemCaseSensitive(pat, "String");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(pt, "behavior");
        const cJSON *inv = cJSON_GetObjectItemCaseSensitive(pt, "invert");
        if (cJSON_IsTrue(inv) || !cJSON_IsString(beh) ||
            (strcmp(beh->valuestring, "Isolated") && strcmp(beh->valuestring, "Removed"))) {
            snprintf(err, errlen, "tokenizer.json: Split behaviour '%s'%s is not supported",
                     cJSON_IsString(beh) ? beh->valuestring : "?",
                     cJSON_IsTrue(inv) ? " with invert" : "");
            return ANV_EUNSUPPORTED;
        }
        st->removed = strcmp(beh->valuestring, "Removed") == 0;
        if (cJSON_IsString(rx)) {
            st->re = s_compile(rx->valuestring, strlen(rx->valuestring), err, errlen);
        } else if (cJSON_IsString(lit)) {
            char *q = s_quote(lit->valuestring);
            st->re = q ? s_compile(q, strlen(q), err, errlen) : NULL;
            free(q);
        } else {
            snprintf(err, errlen, "tokenizer.json: Split without a pattern");
            return ANV_EFORMAT;
        }
        if (!st->re)
            return ANV_EFORMAT;
        st->kind = S_STEP_SPLIT;
    } else if (strcmp(type->valuestring, "Digits") == 0) {
        bool each = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pt, "individual_digits"));
        const char *p = each ? "\\p{N}" : "\\p{N}+";
        st->re = s_compile(p, strlen(p), err, errlen);
        if (!st->re)
            return ANV_EFORMAT;
        st->kind = S_STEP_SPLIT;
    } else if (strcmp(type->valuestring, "ByteLevel") == 0) {
        st->kind = S_STEP_BYTELEVEL;
        st->add_prefix_space =
            cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pt, "add_prefix_space"));
        const cJSON *ur = cJSON_GetObjectItemCaseSensitive(pt, "use_regex");
        if (!cJSON_IsFalse(ur)) { /* default true */
            st->re = s_compile(S_GPT2_PATTERN, strlen(S_GPT2_PATTERN), err, errlen);
            if (!st->re)
                return ANV_EFORMAT;
        }
    } else {
        snprintf(err, errlen, "tokenizer.json: pre-tokenizer '%s' is not supported",
                 type->valuestring);
        return ANV_EUNSUPPORTED;
    }
    self->n_steps++;
    return 0;
}

static const char *s_token_content(const cJSON *j)
{
    if (cJSON_IsString(j))
        return j->valuestring;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

static int s_set_token(eng_tokenizer_t *self, int32_t id, const char *str, char *err, size_t errlen)
{
    if (id < 0 || id >= self->n_ids) {
        snprintf(err, errlen, "tokenizer.json: token id %d out of range", id);
        return ANV_EFORMAT;
    }
    free(self->tok_str[id]);
    self->tok_str[id] = strdup(str);
    if (!self->tok_str[id] || eng_strmap_put(self->vocab, str, strlen(str), id))
        return -ENOMEM;
    return 0;
}

/* The decoded bytes of a token: each character through the inverse byte map, or the string
   itself when one character is outside the map (HF's ByteLevel decoder does the same). */
static int s_token_bytes(const char *str, const int byte_of_cp[512], eng_buf_t *out)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t n = strlen(str);
    eng_buf_t tmp = {0};
    int rc = 0;
    for (size_t i = 0; i < n;) {
        int cp, len = s_utf8_get(s + i, n - i, &cp);
        if (!len || cp >= 512 || byte_of_cp[cp] < 0) {
            eng_buf_release(&tmp);
            return eng_buf_append(out, str, n);
        }
        unsigned char b = (unsigned char)byte_of_cp[cp];
        if ((rc = eng_buf_append(&tmp, &b, 1)))
            break;
        i += (size_t)len;
    }
    if (!rc)
        rc = eng_buf_append(out, tmp.p ? tmp.p : "", tmp.n);
    eng_buf_release(&tmp);
    return rc;
}

static int s_cmp_added_len(const void *a, const void *b, void *ctx)
{
    const s_added_t *added = ctx;
    return (int)added[*(const int *)b].len - (int)added[*(const int *)a].len;
}

static int s_load_merges(eng_tokenizer_t *self, const cJSON *merges, char *err, size_t errlen)
{
    int n = cJSON_GetArraySize(merges);
    self->merges = eng_strmap_new((size_t)n);
    self->merge_into = malloc(((size_t)n + 1) * sizeof(int32_t));
    if (!self->merges || !self->merge_into)
        return -ENOMEM;
    const cJSON *m;
    eng_buf_t cat = {0};
    int rc = 0;
    cJSON_ArrayForEach(m, merges)
    {
        const char *a, *b;
        size_t la, lb;
        char tmp[1024];
        if (cJSON_IsString(m)) {
            const char *sp = strchr(m->valuestring, ' ');
            if (!sp || (size_t)(sp - m->valuestring) >= sizeof(tmp)) {
                snprintf(err, errlen, "tokenizer.json: bad merge '%s'", m->valuestring);
                rc = ANV_EFORMAT;
                goto out;
            }
            memcpy(tmp, m->valuestring, (size_t)(sp - m->valuestring));
            tmp[sp - m->valuestring] = 0;
            a = tmp;
            b = sp + 1;
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
            a = cJSON_GetArrayItem(m, 0)->valuestring;
            b = cJSON_GetArrayItem(m, 1)->valuestring;
        } else {
            snprintf(err, errlen, "tokenizer.json: malformed merge #%d", self->n_merges);
            rc = ANV_EFORMAT;
            goto out;
        }
        la = strlen(a);
        lb = strlen(b);
        int32_t ia, ib, ic;
        cat.n = 0;
        if ((rc = eng_buf_append(&cat, a, la)) || (rc = eng_buf_append(&cat, b, lb)))
            goto out;
        if (!eng_strmap_get(self->vocab, a, la, &ia) || !eng_strmap_get(self->vocab, b, lb, &ib) ||
            !eng_strmap_get(self->vocab, cat.p, cat.n, &ic)) {
            snprintf(err, errlen,
                     "tokenizer.json: merge #%d ('%s' '%s') uses a token missing "
                     "from the vocab",
                     self->n_merges, a, b);
            rc = ANV_EFORMAT;
            goto out;
        }
        int32_t key[2] = {ia, ib}, old;
        if (eng_strmap_get(self->merges, key, sizeof(key), &old))
            continue; /* a repeated pair keeps its first (lowest) rank */
        if ((rc = eng_strmap_put(self->merges, key, sizeof(key), self->n_merges)))
            goto out;
        self->merge_into[self->n_merges++] = ic;
    }
out:
    eng_buf_release(&cat);
    return rc;
}

static int s_load_config(eng_tokenizer_t *self, const char *dir, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    size_t len;
    char *text = eng_read_file(path, &len);
    if (!text)
        return errno == ENOENT ? 0 : -errno;
    cJSON *c = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(c)) {
        cJSON_Delete(c);
        snprintf(err, errlen, "'%s' is not a JSON object", path);
        return ANV_EFORMAT;
    }
    const char *bos = s_token_content(cJSON_GetObjectItemCaseSensitive(c, "bos_token"));
    const char *eos = s_token_content(cJSON_GetObjectItemCaseSensitive(c, "eos_token"));
    if (bos)
        self->bos = eng_tokenizer_find(self, bos);
    if (eos)
        self->eos = eng_tokenizer_find(self, eos);
    self->add_bos = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "add_bos_token"));
    const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(c, "chat_template");
    if (cJSON_IsArray(tpl)) { /* [{name, template}]: take "default", else the first */
        const cJSON *e, *pick = NULL;
        cJSON_ArrayForEach(e, tpl)
        {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
            if (!pick || (cJSON_IsString(nm) && strcmp(nm->valuestring, "default") == 0))
                pick = e;
        }
        tpl = pick ? cJSON_GetObjectItemCaseSensitive(pick, "template") : NULL;
    }
    if (cJSON_IsString(tpl))
        self->chat_template = strdup(tpl->valuestring);
    cJSON_Delete(c);
    return 0;
}

static int s_load(eng_tokenizer_t *self, const char *dir, cJSON *root, char *err, size_t errlen)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE") != 0) {
        snprintf(err, errlen, "tokenizer.json: model type '%s' is not supported (only BPE)",
                 cJSON_IsString(type) ? type->valuestring : "?");
        return ANV_EUNSUPPORTED;
    }
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges)) {
        snprintf(err, errlen, "tokenizer.json: BPE model without vocab or merges");
        return ANV_EFORMAT;
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback")) ||
        cJSON_IsString(cJSON_GetObjectItemCaseSensitive(model, "continuing_subword_prefix")) ||
        cJSON_IsString(cJSON_GetObjectItemCaseSensitive(model, "end_of_word_suffix"))) {
        snprintf(err, errlen,
                 "tokenizer.json: byte_fallback / subword prefixes are not "
                 "supported (byte-level BPE only)");
        return ANV_EUNSUPPORTED;
    }
    self->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (norm && !cJSON_IsNull(norm)) {
        const cJSON *nt = cJSON_GetObjectItemCaseSensitive(norm, "type");
        if (cJSON_IsString(nt) && strcmp(nt->valuestring, "NFC") == 0) {
            ANV_WARN("tokenizer normalizer NFC is not applied: inputs are taken as NFC already");
        } else {
            snprintf(err, errlen, "tokenizer.json: normalizer '%s' is not supported",
                     cJSON_IsString(nt) ? nt->valuestring : "?");
            return ANV_EUNSUPPORTED;
        }
    }
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(dec, "type");
    if (dec && !cJSON_IsNull(dec) &&
        (!cJSON_IsString(dt) || strcmp(dt->valuestring, "ByteLevel"))) {
        snprintf(err, errlen, "tokenizer.json: decoder '%s' is not supported (only ByteLevel)",
                 cJSON_IsString(dt) ? dt->valuestring : "?");
        return ANV_EUNSUPPORTED;
    }
    /* id space: model vocab plus added tokens */
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), *e;
    int max_id = -1;
    cJSON_ArrayForEach(e, vocab)
    {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > (1 << 24)) {
            snprintf(err, errlen, "tokenizer.json: bad id for token '%s'", e->string);
            return ANV_EFORMAT;
        }
        if ((int)e->valuedouble > max_id)
            max_id = (int)e->valuedouble;
    }
    cJSON_ArrayForEach(e, added)
    {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > (1 << 24) ||
            !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "content"))) {
            snprintf(err, errlen, "tokenizer.json: malformed added token");
            return ANV_EFORMAT;
        }
        if ((int)id->valuedouble > max_id)
            max_id = (int)id->valuedouble;
    }
    self->n_ids = max_id + 1;
    self->tok_str = calloc((size_t)self->n_ids + 1, sizeof(char *));
    self->tok_bytes = calloc((size_t)self->n_ids + 1, sizeof(eng_buf_t));
    self->is_special = calloc((size_t)self->n_ids + 1, sizeof(bool));
    self->vocab = eng_strmap_new((size_t)self->n_ids);
    self->added = calloc((size_t)cJSON_GetArraySize(added) + 1, sizeof(s_added_t));
    if (!self->tok_str || !self->tok_bytes || !self->is_special || !self->vocab || !self->added)
        return -ENOMEM;
    int rc;
    cJSON_ArrayForEach(e, vocab) if ((rc = s_set_token(self, (int32_t)e->valuedouble, e->string,
                                                       err, errlen))) return rc;
    if ((rc = s_load_merges(self, merges, err, errlen)))
        return rc;
    cJSON_ArrayForEach(e, added)
    {
        s_added_t *a = &self->added[self->n_added];
        a->id = (int32_t)cJSON_GetObjectItemCaseSensitive(e, "id")->valuedouble;
        a->content = strdup(cJSON_GetObjectItemCaseSensitive(e, "content")->valuestring);
        if (!a->content)
            return -ENOMEM;
        a->len = strlen(a->content);
        a->special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special"));
        a->lstrip = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "lstrip"));
        a->rstrip = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "rstrip"));
        self->n_added++;
        if ((rc = s_set_token(self, a->id, a->content, err, errlen)))
            return rc;
        self->is_special[a->id] = a->special;
        if (a->len == 0)
            continue;
        unsigned char b0 = (unsigned char)a->content[0];
        int *bk = realloc(self->bucket[b0], ((size_t)self->bucket_n[b0] + 1) * sizeof(int));
        if (!bk)
            return -ENOMEM;
        self->bucket[b0] = bk;
        bk[self->bucket_n[b0]++] = self->n_added - 1;
    }
    for (int b = 0; b < 256; b++)
        if (self->bucket_n[b] > 1)
            qsort_r(self->bucket[b], (size_t)self->bucket_n[b], sizeof(int), s_cmp_added_len,
                    self->added);
    /* byte characters and decoded bytes */
    int cp_of_byte[256], byte_of_cp[512];
    s_byte_map(cp_of_byte);
    for (int i = 0; i < 512; i++)
        byte_of_cp[i] = -1;
    for (int b = 0; b < 256; b++) {
        byte_of_cp[cp_of_byte[b]] = b;
        self->byte_char_len[b] = s_utf8_put(self->byte_char[b], cp_of_byte[b]);
        if (!eng_strmap_get(self->vocab, self->byte_char[b], (size_t)self->byte_char_len[b],
                            &self->byte_id[b]))
            self->byte_id[b] = -1;
    }
    for (int id = 0; id < self->n_ids; id++)
        if (self->tok_str[id] &&
            (rc = s_token_bytes(self->tok_str[id], byte_of_cp, &self->tok_bytes[id])))
            return rc;
    /* pre-tokenizer: must include the ByteLevel step that defines a byte-level BPE */
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (!pt || cJSON_IsNull(pt) || (rc = s_add_step(self, pt, err, errlen)) || self->n_steps == 0 ||
        self->steps[self->n_steps - 1].kind != S_STEP_BYTELEVEL) {
        if (!err[0])
            snprintf(err, errlen,
                     "tokenizer.json: pre-tokenizer must end with ByteLevel "
                     "(byte-level BPE only)");
        return rc ? rc : ANV_EUNSUPPORTED;
    }
    return s_load_config(self, dir, err, errlen);
}

eng_tokenizer_t *eng_tokenizer_new(const char *dir, char *err, size_t errlen)
{
    char path[4096];
    err[0] = 0;
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    size_t len;
    char *text = eng_read_file(path, &len);
    if (!text) {
        snprintf(err, errlen, "cannot read '%s': %s", path, strerror(errno));
        return NULL;
    }
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(root)) {
        snprintf(err, errlen, "'%s' is not a JSON object", path);
        cJSON_Delete(root);
        return NULL;
    }
    eng_tokenizer_t *self = calloc(1, sizeof(*self));
    if (!self) {
        cJSON_Delete(root);
        return NULL;
    }
    self->bos = self->eos = -1;
    int rc = s_load(self, dir, root, err, errlen);
    cJSON_Delete(root);
    if (rc) {
        if (!err[0])
            snprintf(err, errlen, "cannot load tokenizer: %s", anv_strerror(rc));
        eng_tokenizer_destroy(&self);
    }
    return self;
}

void eng_tokenizer_destroy(eng_tokenizer_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    eng_tokenizer_t *self = *self_p;
    for (int i = 0; self->tok_str && i < self->n_ids; i++)
        free(self->tok_str[i]);
    for (int i = 0; self->tok_bytes && i < self->n_ids; i++)
        eng_buf_release(&self->tok_bytes[i]);
    free(self->tok_str);
    free(self->tok_bytes);
    free(self->is_special);
    eng_strmap_destroy(&self->vocab);
    eng_strmap_destroy(&self->merges);
    free(self->merge_into);
    for (int i = 0; i < self->n_added; i++)
        free(self->added[i].content);
    free(self->added);
    for (int b = 0; b < 256; b++)
        free(self->bucket[b]);
    for (int i = 0; i < self->n_steps; i++)
        pcre2_code_free(self->steps[i].re);
    free(self->chat_template);
    free(self);
    *self_p = NULL;
}

/* --- encode ------------------------------------------------------------------------------ */

typedef struct {
    size_t off, len;
} s_piece_t;

typedef struct {
    eng_buf_t text;
    s_piece_t *v;
    int n, cap;
} s_pieces_t;

static int s_piece_add(s_pieces_t *p, const char *s, size_t len, bool prefix_space)
{
    if (len == 0 && !prefix_space)
        return 0;
    if (p->n == p->cap) {
        int cap = p->cap ? p->cap * 2 : 64;
        s_piece_t *v = realloc(p->v, (size_t)cap * sizeof(s_piece_t));
        if (!v)
            return -ENOMEM;
        p->v = v;
        p->cap = cap;
    }
    size_t off = p->text.n;
    int rc = (prefix_space ? eng_buf_append(&p->text, " ", 1) : 0);
    if (rc || (rc = eng_buf_append(&p->text, s, len)))
        return rc;
    p->v[p->n].off = off;
    p->v[p->n].len = len + (prefix_space ? 1 : 0);
    p->n++;
    return 0;
}

/* Splits s by re (Isolated: gaps and matches; Removed: gaps only) into out. */
static int s_split(const pcre2_code *re,
                   bool removed,
                   const char *s,
                   size_t n,
                   s_pieces_t *out,
                   pcre2_match_data *md)
{
    size_t pos = 0, last = 0;
    uint32_t opts = 0;
    int rc = 0;
    while (pos <= n) {
        int m = pcre2_match(re, (PCRE2_SPTR)s, n, pos, opts, md, NULL);
        if (m == PCRE2_ERROR_NOMATCH)
            break;
        if (m < 0)
            return ANV_EFORMAT; /* invalid UTF-8 or a matching limit */
        opts = PCRE2_NO_UTF_CHECK;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t b = ov[0], e = ov[1];
        if (e == b) { /* empty match: step over one character */
            pos = b + 1;
            while (pos < n && ((unsigned char)s[pos] & 0xc0) == 0x80)
                pos++;
            continue;
        }
        if ((rc = s_piece_add(out, s + last, b - last, false)))
            return rc;
        if (!removed && (rc = s_piece_add(out, s + b, e - b, false)))
            return rc;
        last = pos = e;
    }
    return s_piece_add(out, s + last, n - last, false);
}

static int s_bpe(const eng_tokenizer_t *self, const char *s, size_t n, eng_ids_t *out)
{
    /* the piece in the byte alphabet */
    eng_buf_t mapped = {0};
    int rc = 0;
    int32_t *sym = NULL, *rank = NULL;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        if ((rc = eng_buf_append(&mapped, self->byte_char[b], (size_t)self->byte_char_len[b])))
            goto out;
    }
    int32_t whole;
    if (self->ignore_merges && eng_strmap_get(self->vocab, mapped.p, mapped.n, &whole)) {
        rc = eng_ids_push(out, whole);
        goto out;
    }
    sym = malloc((n + 1) * sizeof(int32_t));
    rank = malloc((n + 1) * sizeof(int32_t));
    if (!sym || !rank) {
        rc = -ENOMEM;
        goto out;
    }
    int ns = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = self->byte_id[(unsigned char)s[i]];
        if (id >= 0) /* a byte missing from the vocab is dropped, as HF does without unk */
            sym[ns++] = id;
    }
    for (int i = 0; i + 1 < ns; i++) {
        int32_t key[2] = {sym[i], sym[i + 1]};
        if (!eng_strmap_get(self->merges, key, sizeof(key), &rank[i]))
            rank[i] = INT32_MAX;
    }
    while (ns > 1) {
        int best = -1;
        for (int i = 0; i + 1 < ns; i++)
            if (rank[i] != INT32_MAX && (best < 0 || rank[i] < rank[best]))
                best = i;
        if (best < 0)
            break;
        sym[best] = self->merge_into[rank[best]];
        memmove(sym + best + 1, sym + best + 2, (size_t)(ns - best - 2) * sizeof(int32_t));
        memmove(rank + best + 1, rank + best + 2, (size_t)(ns - best - 2) * sizeof(int32_t));
        ns--;
        for (int i = best - 1; i <= best; i++) {
            if (i < 0 || i + 1 >= ns)
                continue;
            int32_t key[2] = {sym[i], sym[i + 1]};
            if (!eng_strmap_get(self->merges, key, sizeof(key), &rank[i]))
                rank[i] = INT32_MAX;
        }
    }
    rc = eng_ids_append(out, sym, ns);
out:
    free(sym);
    free(rank);
    eng_buf_release(&mapped);
    return rc;
}

/* Pre-tokenizes and BPE-encodes one segment free of added tokens. */
static int s_encode_segment(
    const eng_tokenizer_t *self, const char *s, size_t n, pcre2_match_data *md, eng_ids_t *out)
{
    if (n == 0)
        return 0;
    s_pieces_t a = {0}, b = {0};
    int rc = s_piece_add(&a, s, n, false);
    for (int k = 0; k < self->n_steps && !rc; k++) {
        const s_step_t *st = &self->steps[k];
        b.n = 0;
        b.text.n = 0;
        for (int i = 0; i < a.n && !rc; i++) {
            const char *p = a.text.p + a.v[i].off;
            size_t len = a.v[i].len;
            if (st->kind == S_STEP_BYTELEVEL && st->add_prefix_space && p[0] != ' ') {
                /* HF prepends the space to every piece reaching ByteLevel */
                s_pieces_t one = {0};
                rc = s_piece_add(&one, p, len, true);
                if (!rc)
                    rc = st->re ? s_split(st->re, false, one.text.p, one.text.n, &b, md)
                                : s_piece_add(&b, one.text.p, one.text.n, false);
                eng_buf_release(&one.text);
                free(one.v);
            } else if (st->re) {
                rc = s_split(st->re, st->removed, p, len, &b, md);
            } else {
                rc = s_piece_add(&b, p, len, false);
            }
        }
        s_pieces_t t = a;
        a = b;
        b = t;
    }
    for (int i = 0; i < a.n && !rc; i++)
        rc = s_bpe(self, a.text.p + a.v[i].off, a.v[i].len, out);
    eng_buf_release(&a.text);
    eng_buf_release(&b.text);
    free(a.v);
    free(b.v);
    return rc;
}

static bool s_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

int eng_tokenizer_encode(
    const eng_tokenizer_t *self, const char *text, size_t len, bool match_special, eng_ids_t *out)
{
    int cp;
    for (size_t i = 0; i < len;) { /* validate once: PCRE2 would refuse piece by piece */
        int l = s_utf8_get((const unsigned char *)text + i, len - i, &cp);
        if (!l || (cp >= 0xd800 && cp < 0xe000) || cp > 0x10ffff || (l == 2 && cp < 0x80) ||
            (l == 3 && cp < 0x800) || (l == 4 && cp < 0x10000))
            return ANV_EFORMAT;
        i += (size_t)l;
    }
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    if (!md)
        return -ENOMEM;
    int rc = 0;
    size_t seg = 0, i = 0;
    while (i < len && !rc) {
        const s_added_t *hit = NULL;
        unsigned char b0 = (unsigned char)text[i];
        for (int k = 0; k < self->bucket_n[b0]; k++) {
            const s_added_t *a = &self->added[self->bucket[b0][k]];
            if ((match_special || !a->special) && a->len <= len - i &&
                memcmp(text + i, a->content, a->len) == 0) {
                hit = a;
                break;
            }
        }
        if (!hit) {
            i++;
            continue;
        }
        size_t start = i, end = i + hit->len;
        if (hit->lstrip)
            while (start > seg && s_ws(text[start - 1]))
                start--;
        if (hit->rstrip)
            while (end < len && s_ws(text[end]))
                end++;
        rc = s_encode_segment(self, text + seg, start - seg, md, out);
        if (!rc)
            rc = eng_ids_push(out, hit->id);
        seg = i = end;
    }
    if (!rc)
        rc = s_encode_segment(self, text + seg, len - seg, md, out);
    pcre2_match_data_free(md);
    return rc;
}

/* --- decode and lookups ------------------------------------------------------------------ */

int eng_tokenizer_decode(const eng_tokenizer_t *self, const int32_t *ids, int n, eng_buf_t *out)
{
    for (int i = 0; i < n; i++) {
        size_t len;
        const char *b = eng_tokenizer_token_bytes(self, ids[i], &len);
        int rc = b ? eng_buf_append(out, b, len) : 0;
        if (rc)
            return rc;
    }
    if (!out->p)
        return eng_buf_append(out, "", 0);
    return 0;
}

const char *eng_tokenizer_token_bytes(const eng_tokenizer_t *self, int32_t id, size_t *len)
{
    if (id < 0 || id >= self->n_ids || !self->tok_str[id])
        return NULL;
    *len = self->tok_bytes[id].n;
    return self->tok_bytes[id].p ? self->tok_bytes[id].p : "";
}

int32_t eng_tokenizer_find(const eng_tokenizer_t *self, const char *content)
{
    int32_t id;
    return eng_strmap_get(self->vocab, content, strlen(content), &id) ? id : -1;
}

bool eng_tokenizer_is_special(const eng_tokenizer_t *self, int32_t id)
{
    return id >= 0 && id < self->n_ids && self->is_special[id];
}

int eng_tokenizer_size(const eng_tokenizer_t *self)
{
    return self->n_ids;
}

int32_t eng_tokenizer_bos(const eng_tokenizer_t *self)
{
    return self->bos;
}

int32_t eng_tokenizer_eos(const eng_tokenizer_t *self)
{
    return self->eos;
}

bool eng_tokenizer_add_bos(const eng_tokenizer_t *self)
{
    return self->add_bos;
}

const char *eng_tokenizer_chat_template(const eng_tokenizer_t *self)
{
    return self->chat_template;
}

/* --- streaming --------------------------------------------------------------------------- */

void eng_detok_init(eng_detok_t *d, const eng_tokenizer_t *tok)
{
    memset(d, 0, sizeof(*d));
    d->tok = tok;
}

int eng_detok_push(eng_detok_t *d, int32_t id, eng_buf_t *out)
{
    size_t len;
    const char *b = eng_tokenizer_token_bytes(d->tok, id, &len);
    if (!b || len == 0)
        return 0;
    eng_buf_t tmp = {0};
    int rc = eng_buf_append(&tmp, d->pending, (size_t)d->n_pending);
    if (!rc)
        rc = eng_buf_append(&tmp, b, len);
    if (!rc) {
        size_t keep = eng_utf8_complete_prefix(tmp.p, tmp.n);
        rc = eng_buf_append(out, tmp.p, keep);
        d->n_pending = (int)(tmp.n - keep);
        memcpy(d->pending, tmp.p + keep, (size_t)d->n_pending);
    }
    eng_buf_release(&tmp);
    return rc;
}

int eng_detok_flush(eng_detok_t *d, eng_buf_t *out)
{
    int rc = eng_buf_append(out, d->pending, (size_t)d->n_pending);
    d->n_pending = 0;
    return rc;
}
