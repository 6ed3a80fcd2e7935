/*  test_cli_import.c - the benchmark importers on the real datasets (cli/cli_import.c).

    Reads KernelBench and TritonBench from $ANVIL_SHARED_DIR/datasets (skipped, exit 77, when
    they are not there), writes JSONL into a temp file and reads every line back through the
    real prompt-file reader: the counts must match the datasets, every reference must be the
    file's own text, the prompts must carry the benchmark's instructions. Error paths: a
    missing dataset, a TritonBench source without its separator, a file that is not a
    KernelBench problem.
*/
#include "cli_import.h"
#include "cli_jsonl.h"

#include "anv_error.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

static char s_data[1024]; /* .../datasets */
static char s_tmp[256];

#define assert_contains(hay, needle)                                                               \
    do {                                                                                           \
        if (!strstr((hay), (needle)))                                                              \
            fail_msg("'%.200s' does not contain '%s'", (hay), (needle));                           \
    } while (0)

static char *s_slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = 0;
    fclose(f);
    return s;
}

static size_t s_count_py(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strlen(e->d_name) > 3 && !strcmp(e->d_name + strlen(e->d_name) - 3, ".py"))
            n++;
    closedir(d);
    return n;
}

typedef void (*s_check_fn)(const Anvil__Task *t, size_t i);

/* Imports into a temp file, then validates every line with the reader. Returns the count. */
static size_t s_import(cli_bench_t b, const char *dir, const cli_import_opts_t *o, s_check_fn fn)
{
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/out.jsonl", s_tmp);
    FILE *out = fopen(path, "w");
    assert_non_null(out);
    size_t count = 0;
    int rc = cli_import_run(b, dir, o, out, &count, err, sizeof err);
    fclose(out);
    if (rc)
        fail_msg("import failed: %s", err);
    cli_jsonl_t *r = cli_jsonl_open(path, err, sizeof err);
    assert_non_null(r);
    Anvil__Task *t = NULL;
    size_t n = 0;
    while ((rc = cli_jsonl_next(r, &t)) == 1) {
        assert_non_null(t->ref);
        assert_int_equal(t->n_messages, 1);
        assert_string_equal(t->messages[0]->role, "user");
        if (fn)
            fn(t, n);
        n++;
        cli_task_free(&t);
    }
    if (rc)
        fail_msg("line does not read back: %s", cli_jsonl_errstr(r));
    assert_int_equal(cli_jsonl_format(r), CLI_FMT_ANVIL);
    cli_jsonl_destroy(&r);
    assert_int_equal(n, count);
    return n;
}

static void s_check_kb(const Anvil__Task *t, size_t i)
{
    assert_int_equal(t->ref->kind, ANVIL__TASK_KIND__TASK_KIND_KERNELBENCH);
    char path[2048];
    snprintf(path, sizeof path, "%s/kernelbench/%s", s_data, t->ref->name);
    char *src = s_slurp(path);
    assert_string_equal(t->ref->reference_code, src);
    const char *p = t->messages[0]->content;
    assert_contains(p, "custom Triton kernels");
    assert_contains(p, "Name your optimized output architecture ModelNew");
    assert_contains(p, "@triton.jit"); /* the worked example */
    assert_contains(p, src);           /* the problem itself */
    assert_contains(t->ref->extra_json, "\"level\":");
    assert_null(t->ref->test_code);
    free(src);
}

static void test_kernelbench_all_levels(void **state)
{
    char dir[1100], l1[1200], l2[1200];
    snprintf(dir, sizeof dir, "%s/kernelbench", s_data);
    snprintf(l1, sizeof l1, "%s/level1", dir);
    snprintf(l2, sizeof l2, "%s/level2", dir);
    cli_import_opts_t o = {0};
    size_t n = s_import(CLI_BENCH_KERNELBENCH, dir, &o, s_check_kb);
    assert_int_equal(n, s_count_py(l1) + s_count_py(l2));
    assert_true(n >= 180);
}

static void s_check_kb_first(const Anvil__Task *t, size_t i)
{
    static int last = -1;
    /* sorted by problem number, not by name: 1, 2, 3, ... */
    const char *num = t->custom_id + strlen("kernelbench/level1/");
    assert_int_equal(strncmp(t->custom_id, "kernelbench/level1/", 19), 0);
    int id = atoi(num);
    if (i == 0)
        last = -1;
    assert_true(id > last);
    last = id;
}

static void test_kernelbench_level_limit_match(void **state)
{
    char dir[1100], l1[1200];
    snprintf(dir, sizeof dir, "%s/kernelbench", s_data);
    snprintf(l1, sizeof l1, "%s/level1", dir);
    cli_import_opts_t o = {.level = 1, .limit = 5};
    assert_int_equal(s_import(CLI_BENCH_KERNELBENCH, dir, &o, s_check_kb_first), 5);
    cli_import_opts_t all1 = {.level = 1};
    assert_int_equal(s_import(CLI_BENCH_KERNELBENCH, dir, &all1, s_check_kb_first),
                     s_count_py(l1));
    /* the level folder itself is accepted as DIR */
    cli_import_opts_t m = {.match = "ReLU"};
    assert_true(s_import(CLI_BENCH_KERNELBENCH, l1, &m, s_check_kb) >= 1);
}

static void s_check_tbg(const Anvil__Task *t, size_t i)
{
    assert_int_equal(t->ref->kind, ANVIL__TASK_KIND__TASK_KIND_TRITONBENCH_G);
    assert_int_equal(strncmp(t->custom_id, "tritonbench-g/", 14), 0);
    assert_non_null(t->ref->test_code);
    assert_contains(t->ref->test_code, "def test_");
    assert_null(strstr(t->ref->test_code, "####################"));
    assert_contains(t->messages[0]->content, "write a kernel and its wrapper");
    char path[2048];
    snprintf(path, sizeof path, "%s/tritonbench/%s", s_data, t->ref->name);
    char *src = s_slurp(path);
    /* reference + separator + test is the file */
    assert_int_equal(strncmp(src, t->ref->reference_code, strlen(t->ref->reference_code)), 0);
    assert_contains(src, t->ref->test_code);
    free(src);
}

static void test_tritonbench_g(void **state)
{
    char dir[1100], json[1200];
    snprintf(dir, sizeof dir, "%s/tritonbench", s_data);
    snprintf(json, sizeof json, "%s/TritonBench_G_v1.json", dir);
    cli_import_opts_t o = {0};
    size_t n = s_import(CLI_BENCH_TRITONBENCH_G, dir, &o, s_check_tbg);
    assert_int_equal(n, 164);
    /* the prompt is the benchmark's instruction, complex by default, simple on request */
    char *text = s_slurp(json);
    cJSON *list = cJSON_Parse(text);
    free(text);
    cJSON *first = cJSON_GetArrayItem(list, 0);
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/out.jsonl", s_tmp);
    for (int simple = 0; simple < 2; simple++) {
        FILE *out = fopen(path, "w");
        size_t count;
        cli_import_opts_t one = {.limit = 1, .simple_instruction = simple};
        assert_int_equal(cli_import_run(CLI_BENCH_TRITONBENCH_G, dir, &one, out, &count, err,
                                        sizeof err),
                         0);
        fclose(out);
        cli_jsonl_t *r = cli_jsonl_open(path, err, sizeof err);
        Anvil__Task *t = NULL;
        assert_int_equal(cli_jsonl_next(r, &t), 1);
        const char *want =
            cJSON_GetObjectItem(first, simple ? "simp_instru" : "comp_instru")->valuestring;
        assert_contains(t->messages[0]->content, want);
        cli_task_free(&t);
        cli_jsonl_destroy(&r);
    }
    cJSON_Delete(list);
}

static void s_check_tbt(const Anvil__Task *t, size_t i)
{
    assert_int_equal(t->ref->kind, ANVIL__TASK_KIND__TASK_KIND_TRITONBENCH_T);
    assert_contains(t->ref->test_code, "def test_");
    assert_contains(t->ref->reference_code, "import torch");
    assert_contains(t->messages[0]->content, "Functional Description: ");
    assert_contains(t->messages[0]->content, "Wrapper Entry Information: ");
}

static void test_tritonbench_t(void **state)
{
    char dir[1100], json[1200];
    snprintf(dir, sizeof dir, "%s/tritonbench", s_data);
    snprintf(json, sizeof json, "%s/TritonBench_T_v1.json", dir);
    if (access(json, R_OK) != 0) {
        /* TritonBench-T is optional in the datasets: then the importer must say so */
        char err[512];
        size_t count;
        FILE *out = tmpfile();
        assert_int_equal(cli_import_run(CLI_BENCH_TRITONBENCH_T, dir, NULL, out, &count, err,
                                        sizeof err),
                         ANV_ENOTFOUND);
        fclose(out);
        assert_contains(err, "TritonBench_T_v1");
        skip();
    }
    cli_import_opts_t o = {0};
    assert_int_equal(s_import(CLI_BENCH_TRITONBENCH_T, dir, &o, s_check_tbt), 146);
}

static void test_missing_and_broken(void **state)
{
    char err[512];
    size_t count = 7;
    FILE *out = tmpfile();
    assert_int_equal(cli_import_run(CLI_BENCH_KERNELBENCH, "/nonexistent", NULL, out, &count, err,
                                    sizeof err),
                     ANV_ENOTFOUND);
    assert_int_equal(count, 0);
    assert_contains(err, "'/nonexistent' is not a directory");
    assert_int_equal(cli_import_run(CLI_BENCH_KERNELBENCH, s_tmp, NULL, out, &count, err,
                                    sizeof err),
                     ANV_ENOTFOUND);
    assert_contains(err, "holds no KernelBench problems");

    /* a TritonBench-G tree whose only source lacks the separator */
    char p[600];
    snprintf(p, sizeof p, "%s/TritonBench_G_v1", s_tmp);
    assert_int_equal(mkdir(p, 0700), 0);
    snprintf(p, sizeof p, "%s/TritonBench_G_v1/op.py", s_tmp);
    FILE *f = fopen(p, "w");
    fputs("import triton\n\ndef test_op():\n    pass\n", f);
    fclose(f);
    snprintf(p, sizeof p, "%s/TritonBench_G_v1.json", s_tmp);
    f = fopen(p, "w");
    fputs("[{\"file\": \"op.py\", \"comp_instru\": \"write op\", \"simp_instru\": \"op\"}]", f);
    fclose(f);
    assert_int_equal(cli_import_run(CLI_BENCH_TRITONBENCH_G, s_tmp, NULL, out, &count, err,
                                    sizeof err),
                     ANV_EFORMAT);
    assert_contains(err, "op.py' has no line of '#'");
    /* the T channel is not in this tree */
    assert_int_equal(cli_import_run(CLI_BENCH_TRITONBENCH_T, s_tmp, NULL, out, &count, err,
                                    sizeof err),
                     ANV_ENOTFOUND);
    assert_contains(err, "does not hold TritonBench_T_v1");
    /* an entry escaping its folder is refused */
    f = fopen(p, "w");
    fputs("[{\"file\": \"../../etc/passwd\", \"comp_instru\": \"x\"}]", f);
    fclose(f);
    assert_int_equal(cli_import_run(CLI_BENCH_TRITONBENCH_G, s_tmp, NULL, out, &count, err,
                                    sizeof err),
                     ANV_EFORMAT);
    assert_contains(err, "no usable 'file'");

    /* a level folder with a file that is not a problem */
    snprintf(p, sizeof p, "%s/level1", s_tmp);
    assert_int_equal(mkdir(p, 0700), 0);
    snprintf(p, sizeof p, "%s/level1/1_Nothing.py", s_tmp);
    f = fopen(p, "w");
    fputs("print('hello')\n", f);
    fclose(f);
    assert_int_equal(cli_import_run(CLI_BENCH_KERNELBENCH, s_tmp, NULL, out, &count, err,
                                    sizeof err),
                     ANV_EFORMAT);
    assert_contains(err, "is not a KernelBench problem");
    fclose(out);

    cli_bench_t b;
    assert_int_equal(cli_import_bench_parse("tritonbench-t", &b), 0);
    assert_int_equal(b, CLI_BENCH_TRITONBENCH_T);
    assert_int_equal(cli_import_bench_parse("tritonbench", &b), ANV_ECONFIG);
}

static int s_setup(void **state)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(s_tmp, sizeof s_tmp, "%s/anvil-cli-import-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    return mkdtemp(s_tmp) ? 0 : -1;
}

static int s_teardown(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const char *shared = getenv("ANVIL_SHARED_DIR");
    snprintf(s_data, sizeof s_data, "%s/datasets", shared && *shared ? shared : "../shared");
    char kb[1100], tb[1100];
    snprintf(kb, sizeof kb, "%s/kernelbench/level1", s_data);
    snprintf(tb, sizeof tb, "%s/tritonbench/TritonBench_G_v1.json", s_data);
    if (access(kb, R_OK) != 0 || access(tb, R_OK) != 0) {
        printf("skipped: the datasets are not in '%s' (set ANVIL_SHARED_DIR)\n", s_data);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernelbench_all_levels),
        cmocka_unit_test(test_kernelbench_level_limit_match),
        cmocka_unit_test(test_tritonbench_g),
        cmocka_unit_test(test_tritonbench_t),
        cmocka_unit_test(test_missing_and_broken),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
