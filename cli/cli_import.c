/*  cli_import.c - benchmark importers: KernelBench and TritonBench (G and T) to prompt JSONL.

    The benchmark is located first (several layouts are accepted: the dataset folder, the
    upstream repository root, or the problem folder itself) and every file is read before the
    line for it is written, so an unreadable file stops the import with its path. Lines are
    built as cJSON objects and printed unformatted, which escapes the sources correctly. The
    prompts are written out here rather than read from the upstream repositories, because the
    datasets ship the problems but not the prompt templates; their wording follows the
    benchmarks' own (KernelBench's one-shot Triton prompt, TritonBench's alpaca instructions).
*/
#include "cli_import.h"

#include "anv_error.h"
#include "anv_jsonl.h"
#include "cli_util.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define S_MAX_SOURCE (8u << 20)
#define S_MAX_JSON (256u << 20)

/* ---------------------------------------------------------------------------------------- */
/* prompts */

static const char s_kb_intro[] =
    "You write custom Triton kernels to replace the PyTorch operators in the given "
    "architecture to get speedups.\n\n"
    "You have complete freedom to choose the set of operators you want to replace. You may "
    "replace some operators with custom Triton kernels and leave others unchanged. You may "
    "replace several operators with one custom implementation, consider operator fusion "
    "opportunities (combining multiple operators into a single kernel, for example matmul + "
    "relu), or algorithmic changes (such as online softmax). You are only limited by your "
    "imagination.\n\n"
    "Here is an example that shows the syntax of a custom Triton kernel called from a PyTorch "
    "module. The example architecture is:\n\n";

static const char s_kb_example_ref[] =
    "```python\n"
    "import torch\n"
    "import torch.nn as nn\n"
    "\n"
    "\n"
    "class Model(nn.Module):\n"
    "    def __init__(self) -> None:\n"
    "        super().__init__()\n"
    "\n"
    "    def forward(self, a, b):\n"
    "        return a + b\n"
    "\n"
    "\n"
    "def get_inputs():\n"
    "    a = torch.randn(1, 128).cuda()\n"
    "    b = torch.randn(1, 128).cuda()\n"
    "    return [a, b]\n"
    "\n"
    "\n"
    "def get_init_inputs():\n"
    "    return []\n"
    "```\n\n";

static const char s_kb_example_new[] =
    "The example new architecture with a custom Triton kernel looks like this:\n\n"
    "```python\n"
    "import torch\n"
    "import torch.nn as nn\n"
    "import triton\n"
    "import triton.language as tl\n"
    "\n"
    "\n"
    "@triton.jit\n"
    "def add_kernel(a_ptr, b_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):\n"
    "    pid = tl.program_id(axis=0)\n"
    "    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)\n"
    "    mask = offsets < n_elements\n"
    "    a = tl.load(a_ptr + offsets, mask=mask)\n"
    "    b = tl.load(b_ptr + offsets, mask=mask)\n"
    "    tl.store(out_ptr + offsets, a + b, mask=mask)\n"
    "\n"
    "\n"
    "def triton_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:\n"
    "    a = a.contiguous()\n"
    "    b = b.contiguous()\n"
    "    out = torch.empty_like(a)\n"
    "    n_elements = out.numel()\n"
    "    grid = lambda meta: (triton.cdiv(n_elements, meta[\"BLOCK_SIZE\"]),)\n"
    "    add_kernel[grid](a, b, out, n_elements, BLOCK_SIZE=1024)\n"
    "    return out\n"
    "\n"
    "\n"
    "class ModelNew(nn.Module):\n"
    "    def __init__(self) -> None:\n"
    "        super().__init__()\n"
    "\n"
    "    def forward(self, a, b):\n"
    "        return triton_add(a, b)\n"
    "```\n\n";

static const char s_kb_given[] = "You are given the following architecture:\n\n";

static const char s_kb_task[] =
    "Optimize the architecture named Model with custom Triton kernels! Name your optimized "
    "output architecture ModelNew. Output the new code in codeblocks. Please generate real "
    "code, NOT pseudocode, make sure the code compiles and is fully functional. Just output "
    "the new model code, no other text, and NO testing code!\n";

static const char s_tbg_intro[] =
    "You are an expert in writing Triton operators for efficient GPU programming. Use the "
    "Triton language to write a kernel and its wrapper according to the following "
    "instruction.\n";

static const char s_tbt_intro[] =
    "You are an expert in Triton programming, capable of writing Triton kernels and wrapper "
    "functions from functional descriptions and function parameters. Make sure the wrapper "
    "function fully corresponds to the provided function information.\n";

static const char s_tbt_outro[] = "After generation, verify that the Triton wrapper matches the "
                                  "provided func_inputs. If it does not, regenerate.";

/* ---------------------------------------------------------------------------------------- */
/* a growable string */

typedef struct {
    char *s;
    size_t len, cap;
    bool oom;
} s_buf_t;

static void s_add(s_buf_t *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
}

static void s_adds(s_buf_t *b, const char *s)
{
    s_add(b, s, strlen(s));
}

static char *s_done(s_buf_t *b)
{
    if (b->oom || !b->s) {
        free(b->s);
        return NULL;
    }
    return b->s;
}

char *cli_import_kernelbench_prompt(const char *ref_src)
{
    s_buf_t b = {0};
    s_adds(&b, s_kb_intro);
    s_adds(&b, s_kb_example_ref);
    s_adds(&b, s_kb_example_new);
    s_adds(&b, s_kb_given);
    s_adds(&b, "```python\n");
    s_adds(&b, ref_src);
    if (b.len && b.s[b.len - 1] != '\n')
        s_adds(&b, "\n");
    s_adds(&b, "```\n\n");
    s_adds(&b, s_kb_task);
    return s_done(&b);
}

/* ---------------------------------------------------------------------------------------- */
/* files */

static bool s_is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool s_is_file(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int s_read_file(const char *path, size_t max, char **out, char *err, size_t errlen)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        snprintf(err, errlen, "cannot open '%s': %s", path, strerror(e));
        return e == ENOENT ? ANV_ENOTFOUND : -e;
    }
    s_buf_t b = {0};
    char chunk[65536];
    size_t n;
    int rc = 0;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (b.len + n > max) {
            snprintf(err, errlen, "'%s' is larger than %zu MiB", path, max >> 20);
            rc = ANV_ETOOBIG;
            break;
        }
        s_add(&b, chunk, n);
    }
    if (!rc && ferror(f)) {
        snprintf(err, errlen, "cannot read '%s': %s", path, strerror(errno));
        rc = -EIO;
    }
    fclose(f);
    if (!rc && b.len == 0) {
        snprintf(err, errlen, "'%s' is empty", path);
        rc = ANV_EFORMAT;
    }
    if (!rc && (b.oom || memchr(b.s, 0, b.len))) {
        snprintf(err, errlen, b.oom ? "out of memory reading '%s'" : "'%s' is not a text file",
                 path);
        rc = b.oom ? -ENOMEM : ANV_EFORMAT;
    }
    if (rc) {
        free(b.s);
        return rc;
    }
    *out = b.s;
    return 0;
}

/* Splits TritonBench source at its separator (a line of at least 20 '#'; the last one when a
   file has several, as quantize_kv_copy.py does, so that the test holds no operator code):
   the reference before, the test after. Both are new strings. */
static int s_split_test(const char *src, const char *path, char **ref, char **test, char *err,
                        size_t errlen)
{
    *ref = *test = NULL;
    const char *sep = NULL, *after = NULL;
    for (const char *line = src; *line;) {
        const char *eol = strchr(line, '\n');
        size_t n = eol ? (size_t)(eol - line) : strlen(line);
        size_t hashes = 0;
        while (hashes < n && line[hashes] == '#')
            hashes++;
        size_t k = hashes;
        while (k < n && isspace((unsigned char)line[k]))
            k++;
        if (hashes >= 20 && k == n) {
            sep = line;
            after = eol ? eol + 1 : line + n;
        }
        line = eol ? eol + 1 : line + n;
    }
    size_t rl = sep ? (size_t)(sep - src) : 0;
    while (rl && (src[rl - 1] == '\n' || src[rl - 1] == ' '))
        rl--;
    while (after && *after == '\n')
        after++;
    if (!sep || !rl || !*after) {
        snprintf(err, errlen, "'%s' has no line of '#' between a reference and a test", path);
        return ANV_EFORMAT;
    }
    *ref = strndup(src, rl);
    *test = strdup(after);
    if (!*ref || !*test) {
        free(*ref);
        free(*test);
        *ref = *test = NULL;
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* output */

static int s_emit(FILE *out, const char *custom_id, const char *prompt, const char *kind,
                  const char *name, const char *ref, const char *test, cJSON *extra, char *err,
                  size_t errlen)
{
    int rc = 0;
    char *text = NULL;
    cJSON *o = cJSON_CreateObject(), *msgs = cJSON_CreateArray(), *m = cJSON_CreateObject();
    cJSON *task = cJSON_CreateObject();
    if (!o || !msgs || !m || !task) {
        cJSON_Delete(msgs);
        cJSON_Delete(m);
        cJSON_Delete(task);
        cJSON_Delete(extra);
        goto nomem;
    }
    cJSON_AddStringToObject(o, "custom_id", custom_id);
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", prompt);
    cJSON_AddItemToArray(msgs, m);
    cJSON_AddItemToObject(o, "messages", msgs);
    cJSON_AddStringToObject(task, "kind", kind);
    cJSON_AddStringToObject(task, "name", name);
    cJSON_AddStringToObject(task, "reference_code", ref);
    if (test)
        cJSON_AddStringToObject(task, "test_code", test);
    if (extra)
        cJSON_AddItemToObject(task, "extra", extra);
    cJSON_AddItemToObject(o, "task", task);
    if (!(text = cJSON_PrintUnformatted(o)))
        goto nomem;
    if (anv_jsonl_write(text, out) < 0) {
        snprintf(err, errlen, "cannot write the output: %s", strerror(errno));
        rc = -EIO;
    }
    goto out;
nomem:
    snprintf(err, errlen, "out of memory");
    rc = -ENOMEM;
out:
    free(text);
    cJSON_Delete(o);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* KernelBench */

typedef struct {
    int id;
    char *file;
} s_problem_t;

static int s_problem_cmp(const void *a, const void *b)
{
    const s_problem_t *x = a, *y = b;
    return x->id != y->id ? (x->id < y->id ? -1 : 1) : strcmp(x->file, y->file);
}

/* Problems of one level folder, sorted by number. */
static int s_kb_list(const char *dir, s_problem_t **out, size_t *n, char *err, size_t errlen)
{
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(err, errlen, "cannot open '%s': %s", dir, strerror(errno));
        return -errno;
    }
    size_t cap = 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *nm = e->d_name;
        size_t len = strlen(nm);
        char *end;
        long id = strtol(nm, &end, 10);
        if (!isdigit((unsigned char)nm[0]) || *end != '_' || len < 4 || strcmp(nm + len - 3, ".py"))
            continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 128;
            s_problem_t *p = realloc(*out, cap * sizeof *p);
            if (!p) {
                rc = -ENOMEM;
                break;
            }
            *out = p;
        }
        (*out)[*n].id = (int)id;
        if (!((*out)[*n].file = strdup(nm))) {
            rc = -ENOMEM;
            break;
        }
        (*n)++;
    }
    closedir(d);
    if (rc) {
        snprintf(err, errlen, "out of memory");
        return rc;
    }
    if (*n)
        qsort(*out, *n, sizeof **out, s_problem_cmp);
    return 0;
}

static bool s_name_matches(const char *name, const cli_import_opts_t *o)
{
    return !o->match || !*o->match || strstr(name, o->match);
}

static int s_kb_level(const char *dir, int level, const cli_import_opts_t *o, FILE *out,
                      size_t *count, char *err, size_t errlen)
{
    s_problem_t *ps = NULL;
    size_t n = 0;
    int rc = s_kb_list(dir, &ps, &n, err, errlen);
    for (size_t i = 0; !rc && i < n; i++) {
        if (o->limit && *count >= o->limit)
            break;
        char path[4096], name[512], id[600], *src = NULL, *prompt = NULL;
        snprintf(path, sizeof path, "%s/%s", dir, ps[i].file);
        snprintf(name, sizeof name, "level%d/%s", level, ps[i].file);
        if (!s_name_matches(name, o))
            continue;
        snprintf(id, sizeof id, "kernelbench/level%d/%.*s", level,
                 (int)(strlen(ps[i].file) - 3), ps[i].file);
        if ((rc = s_read_file(path, S_MAX_SOURCE, &src, err, errlen)))
            break;
        if (!strstr(src, "class Model") || !strstr(src, "def get_inputs")) {
            snprintf(err, errlen, "'%s' is not a KernelBench problem (no class Model or "
                                  "get_inputs)", path);
            free(src);
            rc = ANV_EFORMAT;
            break;
        }
        if (!(prompt = cli_import_kernelbench_prompt(src))) {
            free(src);
            snprintf(err, errlen, "out of memory");
            rc = -ENOMEM;
            break;
        }
        cJSON *extra = cJSON_CreateObject();
        if (extra) {
            cJSON_AddNumberToObject(extra, "level", level);
            cJSON_AddNumberToObject(extra, "problem_id", ps[i].id);
        }
        rc = s_emit(out, id, prompt, "kernelbench", name, src, NULL, extra, err, errlen);
        if (!rc)
            (*count)++;
        free(src);
        free(prompt);
    }
    for (size_t i = 0; i < n; i++)
        free(ps[i].file);
    free(ps);
    return rc;
}

static int s_kernelbench(const char *dir, const cli_import_opts_t *o, FILE *out, size_t *count,
                         char *err, size_t errlen)
{
    char root[4096], p[4200];
    snprintf(root, sizeof root, "%s", dir);
    snprintf(p, sizeof p, "%s/KernelBench/level1", dir);
    if (s_is_dir(p))
        snprintf(root, sizeof root, "%s/KernelBench", dir);
    /* DIR may be one level folder itself */
    const char *base = strrchr(dir, '/');
    base = base && base[1] ? base + 1 : dir;
    int self_level = 0;
    if (!strncmp(base, "level", 5) && isdigit((unsigned char)base[5]))
        self_level = atoi(base + 5);
    if (self_level > 0 && (!o->level || o->level == self_level))
        return s_kb_level(dir, self_level, o, out, count, err, errlen);
    bool any = false;
    for (int level = 1; level <= 9; level++) {
        if (o->level && level != o->level)
            continue;
        snprintf(p, sizeof p, "%s/level%d", root, level);
        if (!s_is_dir(p))
            continue;
        any = true;
        int rc = s_kb_level(p, level, o, out, count, err, errlen);
        if (rc)
            return rc;
    }
    if (!any) {
        if (o->level)
            snprintf(err, errlen, "'%s' holds no KernelBench level%d/ folder", dir, o->level);
        else
            snprintf(err, errlen, "'%s' holds no KernelBench problems (expected level1/, "
                                  "level2/, ... with N_Name.py files)", dir);
        return ANV_ENOTFOUND;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* TritonBench */

/* Finds <stem>.json (or .jsonl) and the <stem>/ folder of sources under dir. */
static int s_tb_locate(const char *dir, const char *stem, char *json, size_t jlen, char *src,
                       size_t slen, char *err, size_t errlen)
{
    static const char *const subs[] = {"", "/data", "/..", "/tritonbench"};
    static const char *const exts[] = {".json", ".jsonl"};
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++)
        for (size_t k = 0; k < 2; k++) {
            snprintf(json, jlen, "%s%s/%s%s", dir, subs[i], stem, exts[k]);
            snprintf(src, slen, "%s%s/%s", dir, subs[i], stem);
            if (s_is_file(json) && s_is_dir(src))
                return 0;
        }
    snprintf(err, errlen, "'%s' does not hold %s (expected %s.json and the %s/ folder beside "
                          "it; this dataset may not be installed)", dir, stem, stem, stem);
    return ANV_ENOTFOUND;
}

static const char *s_jstr(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int s_tb_prompt(cli_bench_t bench, const cJSON *e, bool simple, char **prompt)
{
    s_buf_t b = {0};
    if (bench == CLI_BENCH_TRITONBENCH_G) {
        const char *ins = s_jstr(e, simple ? "simp_instru" : "comp_instru");
        if (!ins || !*ins)
            return ANV_EFORMAT;
        s_adds(&b, s_tbg_intro);
        s_adds(&b, ins);
    } else {
        const char *desc = s_jstr(e, "description"), *entry = s_jstr(e, "func_inputs");
        const char *math = s_jstr(e, "math"), *other = s_jstr(e, "other");
        if (!desc || !*desc || !entry || !*entry)
            return ANV_EFORMAT;
        s_adds(&b, s_tbt_intro);
        s_adds(&b, "Functional Description: ");
        s_adds(&b, desc);
        s_adds(&b, "\nWrapper Entry Information: ");
        s_adds(&b, entry);
        if (!simple && math && *math) {
            s_adds(&b, "\nMath: ");
            s_adds(&b, math);
        }
        if (!simple && other && *other) {
            s_adds(&b, "\nother: ");
            s_adds(&b, other);
        }
        s_adds(&b, "\n");
        s_adds(&b, s_tbt_outro);
    }
    *prompt = s_done(&b);
    return *prompt ? 0 : -ENOMEM;
}

static int s_tritonbench(cli_bench_t bench, const char *dir, const cli_import_opts_t *o,
                         FILE *out, size_t *count, char *err, size_t errlen)
{
    const bool g = bench == CLI_BENCH_TRITONBENCH_G;
    const char *stem = g ? "TritonBench_G_v1" : "TritonBench_T_v1";
    const char *kind = g ? "tritonbench-g" : "tritonbench-t";
    char json_path[4400], src_dir[4400];
    int rc = s_tb_locate(dir, stem, json_path, sizeof json_path, src_dir, sizeof src_dir, err,
                         errlen);
    if (rc)
        return rc;
    char *text = NULL;
    if ((rc = s_read_file(json_path, S_MAX_JSON, &text, err, errlen)))
        return rc;
    cJSON *list = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsArray(list)) {
        snprintf(err, errlen, "'%s' is not a JSON list of operators", json_path);
        cJSON_Delete(list);
        return ANV_EFORMAT;
    }
    int idx = 0;
    for (const cJSON *e = list->child; e && !rc; e = e->next, idx++) {
        if (o->limit && *count >= o->limit)
            break;
        const char *file = s_jstr(e, "file");
        if (!cJSON_IsObject(e) || !file || !*file || strchr(file, '/') || file[0] == '.') {
            snprintf(err, errlen, "'%s': entry %d has no usable 'file'", json_path, idx);
            rc = ANV_EFORMAT;
            break;
        }
        char stemname[512], name[600], id[700], path[5000];
        snprintf(stemname, sizeof stemname, "%s", file);
        size_t sl = strlen(stemname);
        if (sl > 3 && !strcmp(stemname + sl - 3, ".py"))
            stemname[sl - 3] = 0;
        snprintf(name, sizeof name, "%s/%s", stem, file);
        if (!s_name_matches(name, o))
            continue;
        snprintf(id, sizeof id, "%s/%s", kind, stemname);
        snprintf(path, sizeof path, "%s/%s", src_dir, file);
        char *src = NULL, *ref = NULL, *test = NULL, *prompt = NULL;
        if ((rc = s_read_file(path, S_MAX_SOURCE, &src, err, errlen)) ||
            (rc = s_split_test(src, path, &ref, &test, err, errlen)))
            goto next;
        if ((rc = s_tb_prompt(bench, e, o->simple_instruction, &prompt))) {
            if (rc == ANV_EFORMAT)
                snprintf(err, errlen, "'%s': entry %d ('%s') has no instruction text",
                         json_path, idx, file);
            else
                snprintf(err, errlen, "out of memory");
            goto next;
        }
        cJSON *extra = cJSON_CreateObject();
        if (extra) {
            static const char *const keys[] = {"repo", "difficulty", "name", NULL};
            for (const char *const *k = keys; *k; k++) {
                const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, *k);
                if (v)
                    cJSON_AddItemToObject(extra, *k, cJSON_Duplicate(v, true));
            }
            cJSON_AddStringToObject(extra, "instruction",
                                    o->simple_instruction ? "simple" : "complex");
        }
        rc = s_emit(out, id, prompt, kind, name, ref, test, extra, err, errlen);
        if (!rc)
            (*count)++;
    next:
        free(src);
        free(ref);
        free(test);
        free(prompt);
    }
    cJSON_Delete(list);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */

int cli_import_bench_parse(const char *name, cli_bench_t *bench)
{
    if (!strcmp(name, "kernelbench"))
        *bench = CLI_BENCH_KERNELBENCH;
    else if (!strcmp(name, "tritonbench-g"))
        *bench = CLI_BENCH_TRITONBENCH_G;
    else if (!strcmp(name, "tritonbench-t"))
        *bench = CLI_BENCH_TRITONBENCH_T;
    else
        return ANV_ECONFIG;
    return 0;
}

int cli_import_run(cli_bench_t bench, const char *dir, const cli_import_opts_t *opts, FILE *out,
                   size_t *count, char *err, size_t errlen)
{
    cli_import_opts_t dflt = {0};
    *count = 0;
    if (!opts)
        opts = &dflt;
    if (!s_is_dir(dir)) {
        snprintf(err, errlen, "'%s' is not a directory", dir);
        return ANV_ENOTFOUND;
    }
    if (bench == CLI_BENCH_KERNELBENCH)
        return s_kernelbench(dir, opts, out, count, err, errlen);
    return s_tritonbench(bench, dir, opts, out, count, err, errlen);
}
