/*  eng_chat.c - template family detection and rendering to ids (see eng_chat.h).

    Detection looks for the markers each family's template must contain: "<|im_start|>" for
    ChatML, "bos_token" for Seed-Coder. Rendering encodes "role\ncontent" as one segment
    between the template's special tokens, exactly the text HF's rendered string has there.
*/
#include "eng_chat.h"

#include <stdio.h>
#include <string.h>

#include "anv_error.h"
#include "anv_log.h"

/* Copies into out the literal after "system\n" (real newline or the two characters \n) up
   to the next quote, Jinja tag or <|im_end|>; escapes \n and \' are unescaped. */
static void s_default_system(const char *tpl, char *out, size_t cap)
{
    out[0] = 0;
    for (const char *p = strstr(tpl, "system"); p; p = strstr(p + 1, "system")) {
        const char *q = p + 6;
        if (*q == '\n')
            q++;
        else if (q[0] == '\\' && q[1] == 'n')
            q += 2;
        else
            continue;
        size_t n = 0;
        while (*q && n + 1 < cap) {
            if (*q == '\'' || *q == '"' || strncmp(q, "{{", 2) == 0 || strncmp(q, "{%", 2) == 0 ||
                strncmp(q, "<|im_end|>", 10) == 0)
                break;
            if (q[0] == '\\' && q[1] == 'n') {
                out[n++] = '\n';
                q += 2;
            } else if (q[0] == '\\' && q[1] == '\'') {
                out[n++] = '\'';
                q += 2;
            } else {
                out[n++] = *q++;
            }
        }
        out[n] = 0;
        if (n > 0)
            return;
    }
}

void eng_chat_init(eng_chat_t *chat, const eng_tokenizer_t *tok)
{
    memset(chat, 0, sizeof(*chat));
    const char *tpl = eng_tokenizer_chat_template(tok);
    if (!tpl) {
        ANV_WARN("tokenizer_config.json has no chat_template: chat prompts are sent raw");
        return;
    }
    if (strstr(tpl, "<|im_start|>")) {
        chat->kind = ENG_CHAT_CHATML;
        s_default_system(tpl, chat->default_system, sizeof(chat->default_system));
    } else if (strstr(tpl, "bos_token") && eng_tokenizer_bos(tok) >= 0 &&
               eng_tokenizer_eos(tok) >= 0) {
        s_default_system(tpl, chat->default_system, sizeof(chat->default_system));
        chat->kind = chat->default_system[0] ? ENG_CHAT_SEED_INSTRUCT : ENG_CHAT_SEED_REASONING;
    } else {
        ANV_WARN("chat_template is not one of the supported families (ChatML, Seed-Coder): "
                 "chat prompts are sent raw");
    }
}

const char *eng_chat_kind_name(eng_chat_kind_t kind)
{
    switch (kind) {
    case ENG_CHAT_RAW:
        return "raw";
    case ENG_CHAT_CHATML:
        return "chatml";
    case ENG_CHAT_SEED_INSTRUCT:
        return "seed-coder-instruct";
    case ENG_CHAT_SEED_REASONING:
        return "seed-coder-reasoning";
    }
    return "?";
}

/* open + encode(role "\n" content) + close (+ encode(after)). */
static int s_message(const eng_tokenizer_t *tok,
                     int32_t open,
                     int32_t close,
                     const char *after,
                     const char *role,
                     const char *content,
                     eng_ids_t *out)
{
    eng_buf_t text = {0};
    int rc = eng_ids_push(out, open);
    if (!rc)
        rc = eng_buf_append(&text, role, strlen(role));
    if (!rc)
        rc = eng_buf_append(&text, "\n", 1);
    if (!rc && content)
        rc = eng_buf_append(&text, content, strlen(content));
    if (!rc)
        rc = eng_tokenizer_encode(tok, text.p, text.n, false, out);
    if (!rc && close >= 0)
        rc = eng_ids_push(out, close);
    if (!rc && after)
        rc = eng_tokenizer_encode(tok, after, strlen(after), false, out);
    eng_buf_release(&text);
    return rc;
}

int eng_chat_render(const eng_chat_t *chat,
                    const eng_tokenizer_t *tok,
                    const eng_chat_msg_t *msgs,
                    int n_msgs,
                    bool add_generation_prompt,
                    eng_ids_t *out)
{
    int32_t open, close;
    const char *after = NULL;
    switch (chat->kind) {
    case ENG_CHAT_CHATML:
        open = eng_tokenizer_find(tok, "<|im_start|>");
        close = eng_tokenizer_find(tok, "<|im_end|>");
        after = "\n";
        break;
    case ENG_CHAT_SEED_INSTRUCT:
    case ENG_CHAT_SEED_REASONING:
        open = eng_tokenizer_bos(tok);
        close = eng_tokenizer_eos(tok);
        break;
    default:
        return ANV_EUNSUPPORTED;
    }
    if (open < 0 || close < 0)
        return ANV_EUNSUPPORTED;
    int rc = 0;
    bool has_system = n_msgs > 0 && strcmp(msgs[0].role, "system") == 0;
    if (chat->kind == ENG_CHAT_SEED_REASONING) {
        for (int i = 0; i < n_msgs; i++)
            if (strcmp(msgs[i].role, "system") == 0) {
                ANV_ERROR("the seed-coder reasoning template has no system role");
                return ANV_EUNSUPPORTED;
            }
    } else if (!has_system && chat->default_system[0]) {
        rc = s_message(tok, open, close, after, "system", chat->default_system, out);
    }
    for (int i = 0; i < n_msgs && !rc; i++)
        rc = s_message(tok, open, close, after, msgs[i].role, msgs[i].content, out);
    if (!rc && add_generation_prompt)
        rc = s_message(tok, open, -1, NULL, "assistant", NULL, out);
    return rc;
}

int eng_chat_raw(const eng_tokenizer_t *tok, const char *text, size_t len, eng_ids_t *out)
{
    int start = out->n;
    int rc = eng_tokenizer_encode(tok, text, len, true, out);
    int32_t bos = eng_tokenizer_bos(tok);
    if (rc || !eng_tokenizer_add_bos(tok) || bos < 0)
        return rc;
    if (out->n > start && out->v[start] == bos)
        return 0;
    rc = eng_ids_push(out, bos); /* grow, then shift the prompt right by one */
    if (rc)
        return rc;
    memmove(out->v + start + 1, out->v + start, (size_t)(out->n - 1 - start) * sizeof(int32_t));
    out->v[start] = bos;
    return 0;
}
