/*  test_cli_jsonl.c - unit tests of the prompt-file reader (cli/cli_jsonl.c).

    Each test writes a small file into a private temp dir and reads it back through the real
    reader: valid Anvil and OpenAI Batch lines, every class of malformed line (the error must
    name the line and the reason), duplicate ids, mixed formats, oversize lines, a rewind for
    the second pass and a file that changes between the passes. The JSONL writer
    (anv_jsonl_write) escapes the Unicode line separators, and its lines read back the same.
*/
#include "cli_jsonl.h"

#include "anv_error.h"
#include "anv_jsonl.h"
#include "cli_util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

static char s_dir[256];

static const char *s_write(const char *name, const char *text)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", s_dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(text, 1, strlen(text), f);
    fclose(f);
    return path;
}

static cli_jsonl_t *s_open(const char *name, const char *text)
{
    char err[256];
    cli_jsonl_t *r = cli_jsonl_open(s_write(name, text), err, sizeof err);
    assert_non_null(r);
    return r;
}

/* Reads a one-line file that must fail; returns the reader's error text. */
static const char *s_bad(const char *text)
{
    static char msg[512];
    cli_jsonl_t *r = s_open("bad.jsonl", text);
    Anvil__Task *t = NULL;
    int rc;
    while ((rc = cli_jsonl_next(r, &t)) == 1)
        cli_task_free(&t);
    assert_int_equal(rc, ANV_EFORMAT);
    snprintf(msg, sizeof msg, "%s", cli_jsonl_errstr(r));
    cli_jsonl_destroy(&r);
    return msg;
}

#define assert_contains(hay, needle)                                                               \
    do {                                                                                           \
        if (!strstr((hay), (needle)))                                                              \
            fail_msg("'%s' does not contain '%s'", (hay), (needle));                               \
    } while (0)

static void test_anvil_prompt_and_overrides(void **state)
{
    cli_jsonl_t *r = s_open("a.jsonl",
                            "{\"custom_id\": \"p1\", \"prompt\": \"hello\", \"n\": 4, "
                            "\"temperature\": 0.7, \"top_p\": 0.9, \"top_k\": 50, \"max_tokens\": "
                            "128, \"seed\": 42, \"stop\": [\"</s>\", \"END\"], \"logprobs\": true}\n"
                            "\n"
                            "{\"prompt\": \"second\"}\r\n");
    Anvil__Task *t = NULL;
    assert_int_equal(cli_jsonl_next(r, &t), 1);
    assert_int_equal(cli_jsonl_format(r), CLI_FMT_ANVIL);
    assert_string_equal(t->custom_id, "p1");
    assert_string_equal(t->prompt, "hello");
    assert_true(t->has_n);
    assert_int_equal(t->n, 4);
    assert_non_null(t->sampling);
    assert_true(t->sampling->has_temperature);
    assert_float_equal(t->sampling->temperature, 0.7, 1e-6);
    assert_float_equal(t->sampling->top_p, 0.9, 1e-6);
    assert_int_equal(t->sampling->top_k, 50);
    assert_int_equal(t->sampling->max_tokens, 128);
    assert_int_equal(t->sampling->seed, 42);
    assert_int_equal(t->sampling->n_stop, 2);
    assert_string_equal(t->sampling->stop[1], "END");
    assert_true(t->sampling->has_logprobs && t->sampling->logprobs);
    assert_false(t->sampling->has_min_p);
    cli_task_free(&t);
    /* the blank line is skipped; a line without custom_id gets one from its line number */
    assert_int_equal(cli_jsonl_next(r, &t), 1);
    assert_int_equal(cli_jsonl_line(r), 3);
    assert_string_equal(t->custom_id, "line-3");
    assert_null(t->sampling);
    assert_false(t->has_n);
    cli_task_free(&t);
    assert_int_equal(cli_jsonl_next(r, &t), 0);
    cli_jsonl_destroy(&r);
    assert_null(r);
}

static void test_anvil_messages_and_task(void **state)
{
    cli_jsonl_t *r = s_open(
        "m.jsonl",
        "{\"custom_id\": \"k\", \"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, "
        "{\"role\": \"user\", \"content\": \"write \\u00e9 kernel\"}], \"task\": {\"kind\": "
        "\"kernelbench\", \"name\": \"level1/19_ReLU.py\", \"reference_code\": \"class Model: "
        "pass\", \"extra\": {\"level\": 1}}}\n");
    Anvil__Task *t = NULL;
    assert_int_equal(cli_jsonl_next(r, &t), 1);
    assert_null(t->prompt);
    assert_int_equal(t->n_messages, 2);
    assert_string_equal(t->messages[0]->role, "system");
    assert_string_equal(t->messages[1]->content, "write \xc3\xa9 kernel");
    assert_non_null(t->ref);
    assert_int_equal(t->ref->kind, ANVIL__TASK_KIND__TASK_KIND_KERNELBENCH);
    assert_string_equal(t->ref->name, "level1/19_ReLU.py");
    assert_string_equal(t->ref->reference_code, "class Model: pass");
    assert_string_equal(t->ref->extra_json, "{\"level\":1}");
    cli_task_free(&t);
    cli_jsonl_destroy(&r);
}

static void test_openai_batch(void **state)
{
    cli_jsonl_t *r = s_open(
        "o.jsonl",
        "{\"custom_id\": \"req-1\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", "
        "\"body\": {\"model\": \"gpt-x\", \"messages\": [{\"role\": \"user\", \"content\": "
        "[{\"type\": \"text\", \"text\": \"ab\"}, {\"type\": \"text\", \"text\": \"cd\"}]}], "
        "\"max_tokens\": 64, \"temperature\": 0, \"n\": 3, \"stop\": \"\\n\\n\", "
        "\"presence_penalty\": 0}}\n"
        "{\"custom_id\": \"req-2\", \"body\": {\"messages\": [{\"role\": \"user\", \"content\": "
        "\"x\"}], \"max_completion_tokens\": 9}}\n");
    Anvil__Task *t = NULL;
    assert_int_equal(cli_jsonl_next(r, &t), 1);
    assert_int_equal(cli_jsonl_format(r), CLI_FMT_OPENAI);
    assert_string_equal(t->custom_id, "req-1");
    assert_string_equal(t->messages[0]->content, "abcd");
    assert_int_equal(t->sampling->max_tokens, 64);
    assert_true(t->sampling->has_temperature);
    assert_float_equal(t->sampling->temperature, 0, 0);
    assert_int_equal(t->n, 3);
    assert_int_equal(t->sampling->n_stop, 1);
    assert_string_equal(t->sampling->stop[0], "\n\n");
    cli_task_free(&t);
    assert_int_equal(cli_jsonl_next(r, &t), 1);
    assert_int_equal(t->sampling->max_tokens, 9);
    cli_task_free(&t);
    assert_int_equal(cli_jsonl_next(r, &t), 0);
    cli_jsonl_destroy(&r);
}

static void test_malformed_lines_named(void **state)
{
    /* line 3 is broken: the error names it and reading goes on with line 4 */
    cli_jsonl_t *r = s_open("bad3.jsonl", "{\"prompt\": \"a\"}\n{\"prompt\": \"b\"}\n"
                                          "{\"prompt\": \"c\",}\n{\"prompt\": \"d\"}\n");
    Anvil__Task *t = NULL;
    assert_int_equal(cli_jsonl_next(r, &t), 1);
    cli_task_free(&t);
    assert_int_equal(cli_jsonl_next(r, &t), 1);
    cli_task_free(&t);
    assert_int_equal(cli_jsonl_next(r, &t), ANV_EFORMAT);
    assert_null(t);
    assert_contains(cli_jsonl_errstr(r), "line 3: not valid JSON");
    assert_int_equal(cli_jsonl_next(r, &t), 1);
    assert_string_equal(t->prompt, "d");
    cli_task_free(&t);
    cli_jsonl_destroy(&r);

    assert_contains(s_bad("{\"prompt\": \"a\", \"temprature\": 1}\n"),
                    "line 1: unknown field 'temprature'");
    assert_contains(s_bad("{\"prompt\": \"a\"}\n{\"prompt\": \"a\", \"temperature\": -1}\n"),
                    "line 2: 'temperature' must be a number in [0, 10]");
    assert_contains(s_bad("{\"prompt\": \"a\", \"top_p\": 0}\n"), "'top_p' must be in (0, 1]");
    assert_contains(s_bad("{\"prompt\": \"a\", \"max_tokens\": 1.5}\n"),
                    "'max_tokens' must be an integer");
    assert_contains(s_bad("{\"prompt\": \"a\", \"n\": 0}\n"), "'n' must be an integer in [1, 4096]");
    assert_contains(s_bad("{\"prompt\": \"a\", \"seed\": \"7\"}\n"), "'seed' must be an integer");
    assert_contains(s_bad("{\"prompt\": \"a\", \"messages\": []}\n"), "not both");
    assert_contains(s_bad("{\"custom_id\": \"x\"}\n"), "missing 'prompt' or 'messages'");
    assert_contains(s_bad("{\"prompt\": \"\"}\n"), "'prompt' must be a non-empty string");
    assert_contains(s_bad("{\"prompt\": 5}\n"), "'prompt' must be a non-empty string");
    assert_contains(s_bad("[1, 2]\n"), "a line must be a JSON object");
    assert_contains(s_bad("{\"prompt\": \"a\"} {\"prompt\": \"b\"}\n"), "more than one JSON value");
    assert_contains(s_bad("{\"prompt\": \"\xff\xfe\"}\n"), "not valid UTF-8");
    assert_contains(s_bad("{\"prompt\": \"\xed\xa0\x80\"}\n"), "not valid UTF-8"); /* surrogate */
    assert_contains(s_bad("{\"prompt\": \"\xc0\xaf\"}\n"), "not valid UTF-8");     /* overlong */
    assert_contains(s_bad("{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}\n"),
                    "messages[0] needs a 'role'");
    assert_contains(s_bad("{\"messages\": [{\"role\": \"user\"}]}\n"), "messages[0] has no");
    assert_contains(s_bad("{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": "
                          "\"image_url\"}]}]}\n"),
                    "only text content parts");
    assert_contains(s_bad("{\"prompt\": \"a\", \"stop\": [\"\"]}\n"), "'stop' entries");
    assert_contains(s_bad("{\"prompt\": \"a\", \"stop_token_ids\": [-1]}\n"), "'stop_token_ids'");
    assert_contains(s_bad("{\"prompt\": \"a\", \"custom_id\": 7}\n"), "'custom_id' must be a");
    assert_contains(s_bad("{\"prompt\": \"a\", \"task\": {\"kind\": \"cuda\"}}\n"),
                    "task.kind 'cuda' is not one of");
    assert_contains(s_bad("{\"prompt\": \"a\", \"task\": {\"kind\": \"kernelbench\"}}\n"),
                    "needs a non-empty 'reference_code'");
    assert_contains(s_bad("{\"prompt\": \"a\", \"task\": {\"kind\": \"tritonbench-g\", "
                          "\"reference_code\": \"x\"}}\n"),
                    "needs a non-empty 'test_code'");
    assert_contains(s_bad("{\"prompt\": \"a\", \"task\": {\"kind\": \"none\", \"code\": 1}}\n"),
                    "unknown field 'task.code'");
    assert_contains(s_bad("{\"prompt\": \"a\", \"task\": \"kernelbench\"}\n"),
                    "'task' must be an object");
}

static void test_openai_malformed(void **state)
{
    assert_contains(s_bad("{\"body\": {\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}}\n"),
                    "line 1: missing 'custom_id'");
    assert_contains(s_bad("{\"custom_id\": \"a\", \"url\": \"/v1/embeddings\", \"body\": {}}\n"),
                    "'url' must be");
    assert_contains(s_bad("{\"custom_id\": \"a\", \"method\": \"GET\", \"body\": {}}\n"),
                    "'method' must be");
    assert_contains(s_bad("{\"custom_id\": \"a\", \"body\": {\"max_tokens\": 5}}\n"),
                    "missing body.messages");
    assert_contains(s_bad("{\"custom_id\": \"a\", \"body\": {\"messages\": [{\"role\": \"user\", "
                          "\"content\": \"x\"}], \"tools\": []}}\n"),
                    "unknown field 'body.tools'");
    assert_contains(s_bad("{\"custom_id\": \"a\", \"body\": {\"messages\": [{\"role\": \"user\", "
                          "\"content\": \"x\"}], \"max_tokens\": 0}}\n"),
                    "body.'max_tokens' must be an integer");
    assert_contains(s_bad("{\"custom_id\": \"a\", \"body\": {\"messages\": [{\"role\": \"user\", "
                          "\"content\": \"x\"}], \"presence_penalty\": 0.5}}\n"),
                    "body.presence_penalty is not supported");
    assert_contains(s_bad("{\"custom_id\": \"a\", \"body\": {\"messages\": [{\"role\": \"user\", "
                          "\"content\": \"x\"}], \"stream\": true}}\n"),
                    "body.stream");
    /* /v1/completions takes body.prompt */
    cli_fmt_t fmt = CLI_FMT_UNKNOWN;
    Anvil__Task *t = NULL;
    char err[256];
    const char *line = "{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": "
                       "\"def f():\", \"max_tokens\": 3}}";
    assert_int_equal(cli_jsonl_parse_line(line, strlen(line), &fmt, &t, err, sizeof err), 0);
    assert_int_equal(fmt, CLI_FMT_OPENAI);
    assert_string_equal(t->prompt, "def f():");
    cli_task_free(&t);
}

static void test_duplicates_and_mixed_formats(void **state)
{
    assert_contains(s_bad("{\"custom_id\": \"x\", \"prompt\": \"a\"}\n{\"prompt\": \"b\"}\n"
                          "{\"custom_id\": \"x\", \"prompt\": \"c\"}\n"),
                    "line 3: duplicate custom_id 'x' (first on line 1)");
    /* the default id of line 2 collides with an explicit one */
    assert_contains(s_bad("{\"custom_id\": \"line-2\", \"prompt\": \"a\"}\n{\"prompt\": \"b\"}\n"),
                    "line 2: duplicate custom_id 'line-2'");
    assert_contains(s_bad("{\"custom_id\": \"a\", \"body\": {\"messages\": [{\"role\": \"user\", "
                          "\"content\": \"x\"}]}}\n{\"custom_id\": \"b\", \"prompt\": \"y\"}\n"),
                    "line 2: an Anvil line in a file detected as OpenAI Batch");
}

static void test_many_ids_and_rewind(void **state)
{
    /* enough lines to grow the duplicate table several times; the second pass sees the same */
    char path[512];
    snprintf(path, sizeof path, "%s/many.jsonl", s_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < 20000; i++)
        fprintf(f, "{\"custom_id\": \"id-%d\", \"prompt\": \"p%d\"}\n", i, i);
    fprintf(f, "{\"custom_id\": \"id-123\", \"prompt\": \"dup\"}\n");
    fclose(f);
    char err[256];
    cli_jsonl_t *r = cli_jsonl_open(path, err, sizeof err);
    assert_non_null(r);
    for (int pass = 0; pass < 2; pass++) {
        Anvil__Task *t = NULL;
        int n = 0, rc;
        while ((rc = cli_jsonl_next(r, &t)) == 1) {
            char want[32];
            snprintf(want, sizeof want, "id-%d", n++);
            assert_string_equal(t->custom_id, want);
            cli_task_free(&t);
        }
        assert_int_equal(rc, ANV_EFORMAT);
        assert_contains(cli_jsonl_errstr(r), "line 20001: duplicate custom_id 'id-123' (first on "
                                             "line 124)");
        assert_int_equal(cli_jsonl_next(r, &t), 0);
        assert_int_equal(n, 20000);
        assert_int_equal(cli_jsonl_rewind(r), 0);
    }
    /* a file that changes between the passes is refused */
    f = fopen(path, "a");
    fprintf(f, "{\"prompt\": \"late\"}\n");
    fclose(f);
    assert_int_equal(cli_jsonl_rewind(r), ANV_ESTATE);
    assert_contains(cli_jsonl_errstr(r), "changed while it was being read");
    cli_jsonl_destroy(&r);
}

/* fuzz_jsonl found it (corpus/jsonl/crash-rewind-without-tasks): rewinding a file in which
   no line made a task cleared a duplicate table that was never allocated (memset(NULL), which
   UBSan reports); both passes must report the same malformed lines */
static void test_rewind_without_tasks(void **state)
{
    cli_jsonl_t *r = s_open("none.jsonl", "{\"custom_id\": \"r1\", \"body\": {\n\n{bad\n");
    for (int pass = 0; pass < 2; pass++) {
        Anvil__Task *t = NULL;
        assert_int_equal(cli_jsonl_next(r, &t), ANV_EFORMAT);
        assert_contains(cli_jsonl_errstr(r), "line 1:");
        assert_int_equal(cli_jsonl_next(r, &t), ANV_EFORMAT);
        assert_contains(cli_jsonl_errstr(r), "line 3:");
        assert_int_equal(cli_jsonl_next(r, &t), 0);
        assert_null(t);
        assert_int_equal(cli_jsonl_rewind(r), 0);
    }
    cli_jsonl_destroy(&r);
}

/* fuzz_jsonl found it (corpus/jsonl/crash-blank-first-line): a blank first line was
   terminated in a line buffer not yet allocated (a write through NULL) */
static void test_blank_first_line(void **state)
{
    cli_jsonl_t *r = s_open("blank.jsonl", "\n\n{\"prompt\": \"after blanks\"}\n");
    Anvil__Task *t = NULL;
    assert_int_equal(cli_jsonl_next(r, &t), 1);
    assert_string_equal(t->prompt, "after blanks");
    assert_int_equal(cli_jsonl_line(r), 3);
    cli_task_free(&t);
    assert_int_equal(cli_jsonl_next(r, &t), 0);
    cli_jsonl_destroy(&r);
}

static void test_oversize_line_skipped(void **state)
{
    char path[512];
    snprintf(path, sizeof path, "%s/big.jsonl", s_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"prompt\": \"", f);
    for (unsigned i = 0; i < CLI_JSONL_MAX_LINE / 64 + 10; i++)
        fputs("xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", f);
    fputs("\"}\n{\"prompt\": \"after\"}\n", f);
    fclose(f);
    char err[256];
    cli_jsonl_t *r = cli_jsonl_open(path, err, sizeof err);
    Anvil__Task *t = NULL;
    assert_int_equal(cli_jsonl_next(r, &t), ANV_EFORMAT);
    assert_contains(cli_jsonl_errstr(r), "line 1: longer than 16 MiB");
    assert_int_equal(cli_jsonl_next(r, &t), 1);
    assert_string_equal(t->prompt, "after");
    assert_int_equal(cli_jsonl_line(r), 2);
    cli_task_free(&t);
    cli_jsonl_destroy(&r);
}

static void test_open_errors_and_stdin(void **state)
{
    char err[256];
    assert_null(cli_jsonl_open("/nonexistent/x.jsonl", err, sizeof err));
    assert_contains(err, "cannot open '/nonexistent/x.jsonl'");
    assert_null(cli_jsonl_open(s_dir, err, sizeof err));
    assert_contains(err, "is a directory");
    /* "-" spools standard input and can be read twice */
    const char *p = s_write("stdin.jsonl", "{\"prompt\": \"from stdin\"}\n");
    assert_non_null(freopen(p, "r", stdin));
    cli_jsonl_t *r = cli_jsonl_open("-", err, sizeof err);
    assert_non_null(r);
    for (int pass = 0; pass < 2; pass++) {
        Anvil__Task *t = NULL;
        assert_int_equal(cli_jsonl_next(r, &t), 1);
        assert_string_equal(t->prompt, "from stdin");
        cli_task_free(&t);
        assert_int_equal(cli_jsonl_next(r, &t), 0);
        assert_int_equal(cli_jsonl_rewind(r), 0);
    }
    cli_jsonl_destroy(&r);
    cli_jsonl_destroy(&r); /* idempotent */
}

/* Generated text may hold U+2028, U+2029 and U+0085: the writer escapes them, so the line has
   no byte a Unicode line splitter ends a line at, and it reads back to the same string (other
   non-ASCII text untouched). */
static void test_writer_escapes_line_separators(void **state)
{
    const char *text = "a\xe2\x80\xa8"
                       "b\xe2\x80\xa9"
                       "c\xc2\x85"
                       "d \xc3\xa9\xe2\x80\xa6 \"q\"\n";
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "custom_id", "sep");
    cJSON_AddStringToObject(o, "prompt", text);
    char *json = cJSON_PrintUnformatted(o);
    assert_non_null(json);
    char path[512];
    snprintf(path, sizeof path, "%s/w.jsonl", s_dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(anv_jsonl_write(json, f), 0);
    assert_int_equal(anv_jsonl_write("{\"prompt\": \"\xe2\x80\xa8\"}", f), 0);
    fclose(f);
    free(json);
    cJSON_Delete(o);

    char buf[512];
    f = fopen(path, "rb");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    assert_null(strstr(buf, "\xe2\x80\xa8"));
    assert_null(strstr(buf, "\xe2\x80\xa9"));
    assert_null(strstr(buf, "\xc2\x85"));
    assert_contains(buf, "a\\u2028b\\u2029c\\u0085d \xc3\xa9\xe2\x80\xa6 ");
    const char *last = "{\"prompt\": \"\\u2028\"}\n";
    assert_true(n > strlen(last));
    assert_string_equal(buf + n - strlen(last), last);

    char err[256];
    cli_jsonl_t *r = cli_jsonl_open(path, err, sizeof err);
    assert_non_null(r);
    Anvil__Task *t = NULL;
    assert_int_equal(cli_jsonl_next(r, &t), 1);
    assert_string_equal(t->custom_id, "sep");
    assert_string_equal(t->prompt, text);
    cli_task_free(&t);
    assert_int_equal(cli_jsonl_next(r, &t), 1);
    assert_string_equal(t->prompt, "\xe2\x80\xa8");
    cli_task_free(&t);
    assert_int_equal(cli_jsonl_next(r, &t), 0);
    cli_jsonl_destroy(&r);
}

static int s_setup(void **state)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(s_dir, sizeof s_dir, "%s/anvil-cli-jsonl-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    return mkdtemp(s_dir) ? 0 : -1;
}

static int s_teardown(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_anvil_prompt_and_overrides),
        cmocka_unit_test(test_anvil_messages_and_task),
        cmocka_unit_test(test_openai_batch),
        cmocka_unit_test(test_malformed_lines_named),
        cmocka_unit_test(test_openai_malformed),
        cmocka_unit_test(test_duplicates_and_mixed_formats),
        cmocka_unit_test(test_many_ids_and_rewind),
        cmocka_unit_test(test_rewind_without_tasks),
        cmocka_unit_test(test_blank_first_line),
        cmocka_unit_test(test_oversize_line_skipped),
        cmocka_unit_test(test_open_errors_and_stdin),
        cmocka_unit_test(test_writer_escapes_line_separators),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
