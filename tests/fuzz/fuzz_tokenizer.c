/*  fuzz_tokenizer.c - fuzz target: encode and decode of arbitrary bytes and ids with a real
    byte-level BPE tokenizer (tests/fuzz/tokenizer: trained by tiny_model.py's trainer with a
    vocab of 400 and the Seed-Coder pre-tokenizer, plus its tokenizer_config.json).

    Input: a mode byte, then the payload.
      mode 0/1: the payload is text, encoded without/with special-token matching. Valid UTF-8
                must encode and decode back to the same bytes, and the streaming detokenizer
                must give the same bytes; invalid UTF-8 must be ANV_EFORMAT.
      mode 2:   the payload is little-endian int32 ids (any values): decode and the streaming
                detokenizer must agree and never read outside a token.
      mode 3:   the payload is chat messages separated by NUL (roles cycle user/assistant,
                the first one system when it starts with 's'), rendered with the tokenizer's
                chat template; then the payload as a raw prompt.
*/
#include "anv_error.h"
#include "eng_chat.h"
#include "eng_tokenizer.h"
#include "fuzz_util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static eng_tokenizer_t *s_tok;

static const eng_tokenizer_t *s_tokenizer(void)
{
    if (!s_tok) {
        char err[512] = "";
        s_tok = eng_tokenizer_new(FUZZ_TOKENIZER_DIR, err, sizeof err);
        if (!s_tok) {
            fprintf(stderr, "fuzz_tokenizer: %s\n", err);
            abort();
        }
    }
    return s_tok;
}

static bool s_valid_utf8(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t k = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3
                             : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (!k || i + k > n)
            return false;
        uint32_t cp = k == 1 ? c : c & (0x7F >> k);
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xC0) != 0x80)
                return false;
            cp = cp << 6 | (s[i + j] & 0x3F);
        }
        if ((k == 2 && cp < 0x80) || (k == 3 && cp < 0x800) || (k == 4 && cp < 0x10000) ||
            cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += k;
    }
    return true;
}

static void s_detok(const eng_tokenizer_t *tok, const int32_t *ids, int n, const eng_buf_t *want)
{
    eng_detok_t d;
    eng_buf_t out = {0};
    eng_detok_init(&d, tok);
    for (int i = 0; i < n; i++)
        if (eng_detok_push(&d, ids[i], &out) != 0)
            abort();
    if (eng_detok_flush(&d, &out) != 0 || out.n != want->n ||
        (out.n && memcmp(out.p, want->p, out.n) != 0))
        abort(); /* streaming and one-shot decode disagree */
    eng_buf_release(&out);
}

static void s_text(const eng_tokenizer_t *tok, const uint8_t *p, size_t n, bool special)
{
    eng_ids_t ids = {0};
    int rc = eng_tokenizer_encode(tok, (const char *)p, n, special, &ids);
    bool valid = s_valid_utf8(p, n);
    if (rc != (valid ? 0 : ANV_EFORMAT))
        abort();
    if (rc == 0) {
        eng_buf_t out = {0};
        if (eng_tokenizer_decode(tok, ids.v, ids.n, &out) != 0)
            abort();
        if (out.n != n || (n && memcmp(out.p, p, n) != 0))
            abort(); /* decode(encode(s)) == s */
        s_detok(tok, ids.v, ids.n, &out);
        eng_buf_release(&out);
    }
    eng_ids_release(&ids);
}

static void s_ids(const eng_tokenizer_t *tok, const uint8_t *p, size_t n)
{
    int k = (int)(n / 4);
    int32_t *ids = malloc(((size_t)k + 1) * sizeof *ids);
    if (!ids)
        abort();
    for (int i = 0; i < k; i++)
        ids[i] = (int32_t)((uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 |
                           (uint32_t)p[4 * i + 2] << 16 | (uint32_t)p[4 * i + 3] << 24);
    eng_buf_t out = {0};
    if (eng_tokenizer_decode(tok, ids, k, &out) != 0)
        abort();
    s_detok(tok, ids, k, &out);
    for (int i = 0; i < k; i++) {
        size_t len = 0;
        (void)eng_tokenizer_token_bytes(tok, ids[i], &len);
        (void)eng_tokenizer_is_special(tok, ids[i]);
    }
    eng_buf_release(&out);
    free(ids);
}

static void s_chat(const eng_tokenizer_t *tok, const uint8_t *p, size_t n)
{
    char *text = fuzz_strndup(p, n);
    eng_chat_msg_t msgs[8];
    int k = 0;
    for (char *s = text; k < 8 && s <= text + n; s += strlen(s) + 1) {
        msgs[k].role = k == 0 && s[0] == 's' ? "system" : k % 2 ? "assistant" : "user";
        msgs[k].content = s;
        k++;
    }
    eng_chat_t chat;
    eng_chat_init(&chat, tok);
    eng_ids_t ids = {0};
    (void)eng_chat_render(&chat, tok, msgs, k, true, &ids);
    for (int i = 0; i < ids.n; i++)
        if (ids.v[i] < 0 || ids.v[i] >= eng_tokenizer_size(tok))
            abort();
    eng_ids_release(&ids);
    (void)eng_chat_raw(tok, text, n, &ids);
    eng_ids_release(&ids);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    const eng_tokenizer_t *tok = s_tokenizer();
    if (size == 0)
        return 0;
    switch (data[0] % 4) {
    case 0:
    case 1:
        s_text(tok, data + 1, size - 1, data[0] % 4 == 1);
        break;
    case 2:
        s_ids(tok, data + 1, size - 1);
        break;
    default:
        s_chat(tok, data + 1, size - 1);
        break;
    }
    return 0;
}
