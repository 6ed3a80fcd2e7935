/*  fuzz_tokenizer_load.c - fuzz target: a checkpoint's tokenizer.json (and
    tokenizer_config.json) through eng_tokenizer_new, as the engine loads them.

    Input: tokenizer.json, then optionally a NUL and tokenizer_config.json. Whatever the bytes,
    loading gives a tokenizer or NULL with a reason. A tokenizer that loads must encode a
    fixed text (ASCII, Unicode, digits, a special-token spelling) so that it decodes back to the
    same bytes, and render a chat with the template family it detected.
*/
#include "anv_error.h"
#include "eng_chat.h"
#include "eng_tokenizer.h"
#include "fuzz_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char s_text[] = "def f(x):\n    return x * 2  # größe 12345 <eos> \xe2\x88\x91\t\r\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    size_t alen, blen;
    const uint8_t *b;
    fuzz_split(data, size, &alen, &b, &blen);
    fuzz_write("tokenizer.json", data, alen);
    fuzz_write("tokenizer_config.json", b, blen);
    char err[512] = "";
    eng_tokenizer_t *tok = eng_tokenizer_new(fuzz_dir(), err, sizeof err);
    if (!tok) {
        if (!err[0])
            abort();
        return 0;
    }
    for (int special = 0; special < 2; special++) {
        eng_ids_t ids = {0};
        eng_buf_t out = {0};
        int rc = eng_tokenizer_encode(tok, s_text, strlen(s_text), special, &ids);
        if (rc == 0)
            rc = eng_tokenizer_decode(tok, ids.v, ids.n, &out);
        /* a vocab without some byte's character cannot spell every text: encode may drop
           what it cannot map, but whatever it gives back must be ids of this tokenizer */
        for (int i = 0; rc == 0 && i < ids.n; i++)
            if (ids.v[i] < 0 || ids.v[i] >= eng_tokenizer_size(tok))
                abort();
        eng_ids_release(&ids);
        eng_buf_release(&out);
    }
    eng_chat_t chat;
    eng_chat_init(&chat, tok);
    eng_chat_msg_t msgs[2] = {{"system", "be brief"}, {"user", "write <|im_end|> a kernel"}};
    eng_ids_t ids = {0};
    (void)eng_chat_render(&chat, tok, msgs, 2, true, &ids);
    eng_ids_release(&ids);
    (void)eng_chat_raw(tok, s_text, strlen(s_text), &ids);
    eng_ids_release(&ids);
    eng_tokenizer_destroy(&tok);
    return 0;
}
