/*  eng_chat.h - chat templates rendered straight to token ids.

    The engine does not run Jinja. It recognises the template families it serves from the
    chat_template string in tokenizer_config.json and renders them itself:
      - ChatML (Qwen2): <|im_start|>role\ncontent<|im_end|>\n ..., generation prompt
        <|im_start|>assistant\n, the template's default system prompt when none is given;
      - Seed-Coder Instruct: <bos>role\ncontent<eos> ..., generation prompt <bos>assistant\n,
        with the template's default system prompt;
      - Seed-Coder Reasoning: the same without a system role (a system message is refused).
    The default system prompt is the literal that follows "system\n" in the template. Message
    content is encoded without special-token matching, so text that spells a special token
    cannot inject one; the special tokens come from the template only. Raw mode encodes the text
    as given (special tokens matched) and adds BOS only when tokenizer_config.json asks for it
    and the text does not already start with it: there is never a double BOS.
*/
#ifndef ENG_CHAT_H
#define ENG_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "eng_tokenizer.h"
#include "eng_util.h"

typedef enum {
    ENG_CHAT_RAW = 0,
    ENG_CHAT_CHATML = 1,
    ENG_CHAT_SEED_INSTRUCT = 2,
    ENG_CHAT_SEED_REASONING = 3,
} eng_chat_kind_t;

typedef struct {
    const char *role; /* "system", "user", "assistant" */
    const char *content;
} eng_chat_msg_t;

typedef struct {
    eng_chat_kind_t kind;
    char default_system[1024]; /* empty when the template has none */
} eng_chat_t;

/* Picks the family from the tokenizer's chat template (RAW when there is none or it is not
   recognised; a warning names the reason). */
void eng_chat_init(eng_chat_t *chat, const eng_tokenizer_t *tok);
const char *eng_chat_kind_name(eng_chat_kind_t kind);

/* Appends the ids of the conversation (plus the generation prompt) to out. Returns 0,
   ANV_EUNSUPPORTED (a system message for Reasoning, RAW kind, special tokens missing from
   the vocab) or ANV_EFORMAT (invalid UTF-8). */
int eng_chat_render(const eng_chat_t *chat,
                    const eng_tokenizer_t *tok,
                    const eng_chat_msg_t *msgs,
                    int n_msgs,
                    bool add_generation_prompt,
                    eng_ids_t *out);

/* Raw prompt: encodes text (special tokens matched) with BOS as described above. */
int eng_chat_raw(const eng_tokenizer_t *tok, const char *text, size_t len, eng_ids_t *out);

#endif
