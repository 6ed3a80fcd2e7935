/*  eng_tokenizer.h - Hugging Face tokenizer.json byte-level BPE, encode and exact decode.

    Supported tokenizer.json content: model BPE (vocab, merges as "a b" strings or [a, b]
    pairs, ignore_merges), added tokens (special or not; lstrip/rstrip), pre-tokenizers Split
    (Regex or String pattern, behaviours Isolated and Removed), ByteLevel (add_prefix_space,
    use_regex with the GPT-2 pattern), Digits and Sequence of these, normalizer null (NFC is
    accepted with a warning and not applied: inputs are expected in NFC), decoder ByteLevel.
    Anything else is refused by name at load time. The regexes run on PCRE2 with UTF and UCP
    (Unicode properties for \p{..}, \s, \w), the same semantics as the Rust crate's Oniguruma
    for the patterns tokenizers use.

    Encode: added tokens are found first (leftmost, then longest), the text between them goes
    through the pre-tokenizers, each piece is mapped byte-to-unicode and merged by rank.
    Decode: each token's bytes (byte-level inverse map; added tokens and tokens with characters
    outside the map give their UTF-8 as is), concatenated: decode(encode(s)) == s.
    Streaming: eng_detok_t holds back an incomplete UTF-8 tail until the next token completes
    it. A tokenizer is read-only after load and may be shared between threads.
*/
#ifndef ENG_TOKENIZER_H
#define ENG_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "eng_util.h"

typedef struct eng_tokenizer eng_tokenizer_t;

/* Loads <dir>/tokenizer.json and, when present, <dir>/tokenizer_config.json (bos/eos tokens,
   add_bos_token, chat_template). Returns NULL with the reason in err. */
eng_tokenizer_t *eng_tokenizer_new(const char *dir, char *err, size_t errlen);
void eng_tokenizer_destroy(eng_tokenizer_t **self_p);

/* Appends the ids of text[0, len) to out. With match_special false, added tokens are not
   looked for (user content inside a chat template). Returns 0, ANV_EFORMAT for text that is
   not valid UTF-8, or -ENOMEM. */
int eng_tokenizer_encode(
    const eng_tokenizer_t *self, const char *text, size_t len, bool match_special, eng_ids_t *out);
/* Appends the bytes of ids to out (not necessarily valid UTF-8 for arbitrary ids). Unknown ids
   contribute nothing. */
int eng_tokenizer_decode(const eng_tokenizer_t *self, const int32_t *ids, int n, eng_buf_t *out);
/* The bytes of one token (borrowed), NULL for an unknown id. */
const char *eng_tokenizer_token_bytes(const eng_tokenizer_t *self, int32_t id, size_t *len);
/* Id of the token whose content is exactly `content` (vocab or added), or -1. */
int32_t eng_tokenizer_find(const eng_tokenizer_t *self, const char *content);
bool eng_tokenizer_is_special(const eng_tokenizer_t *self, int32_t id);
/* Number of ids (max id + 1). */
int eng_tokenizer_size(const eng_tokenizer_t *self);

/* From tokenizer_config.json (or -1 / false / NULL when absent). */
int32_t eng_tokenizer_bos(const eng_tokenizer_t *self);
int32_t eng_tokenizer_eos(const eng_tokenizer_t *self);
bool eng_tokenizer_add_bos(const eng_tokenizer_t *self);
const char *eng_tokenizer_chat_template(const eng_tokenizer_t *self);

/* Streaming decode of one sequence. */
typedef struct {
    const eng_tokenizer_t *tok;
    char pending[8];
    int n_pending;
} eng_detok_t;

void eng_detok_init(eng_detok_t *d, const eng_tokenizer_t *tok);
/* Appends to out the text that token `id` completes; an incomplete UTF-8 tail is held back. */
int eng_detok_push(eng_detok_t *d, int32_t id, eng_buf_t *out);
/* Appends whatever is held back (possibly an incomplete sequence). */
int eng_detok_flush(eng_detok_t *d, eng_buf_t *out);

/* Length of the longest prefix of s[0, n) that does not end inside an incomplete (but so far
   valid) UTF-8 sequence. */
size_t eng_utf8_complete_prefix(const char *s, size_t n);

#endif
