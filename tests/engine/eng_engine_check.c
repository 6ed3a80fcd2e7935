/*  eng_engine_check.c - test driver for the engine API paths the CLI does not reach:
    weight reloads with versions, cancel by request id, explicit per-sample seeds.

      eng_engine_check reload DIR_A DIR_B [DIR_BAD]
                                            greedy on A, load B as version 7, greedy again,
                                            then a load of /nonexistent and one of DIR_BAD (a
                                            broken checkpoint of B's config) must fail, and
                                            greedy "c" runs on B
      eng_engine_check cancel DIR           cancel one of two requests mid-flight
      eng_engine_check seeds DIR            duplicate explicit seeds refused, distinct accepted
      eng_engine_check cancel_late DIR      cancel a group after one of its samples finished
                                            (a regression: cancel read the group its last live
                                            sample freed; run it under ASan to see it)

    Prints one JSON line per finished sample ({"id", "index", "tokens", "finish", "version"})
    and "ok" as the last line; the pytest side checks the lines. Exit 0 or 1.
    ENG_CHECK_BACKEND=cuda runs it on the CUDA backend with decode graphs on
    (tests/engine_cuda/reload_graphs.sh: a reload keeps the captured graphs).
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "anv_error.h"
#include "anv_log.h"
#include "eng_engine.h"

static void s_drain(eng_engine_t *e, int *n_out)
{
    eng_sample_t *s;
    while ((s = eng_engine_pop_finished(e))) {
        printf("{\"id\":\"%s\",\"index\":%d,\"finish\":\"%s\",\"version\":%llu,"
               "\"first_version\":%llu,\"tokens\":[",
               s->request_id, s->index, eng_finish_name(s->finish),
               (unsigned long long)s->weight_version, (unsigned long long)s->weight_version_first);
        for (int i = 0; i < s->n_tokens; i++)
            printf("%s%d", i ? "," : "", s->tokens[i]);
        printf("]}\n");
        (*n_out)++;
        eng_sample_destroy(&s);
    }
}

static int s_run(eng_engine_t *e, int *n_out)
{
    while (!eng_engine_idle(e)) {
        int rc = eng_engine_step(e);
        if (rc < 0)
            return rc;
        s_drain(e, n_out);
    }
    s_drain(e, n_out);
    return 0;
}

static eng_request_t s_greedy(const char *id, int max_tokens)
{
    static const int32_t prompt[] = {5, 17, 300, 42, 7};
    eng_request_t r = {.request_id = id,
                       .prompt_ids = prompt,
                       .n_prompt_ids = 5,
                       .n = 2,
                       .max_tokens = max_tokens,
                       .sampling = {0, 0, 1, 0, 0},
                       .has_seed = true,
                       .seed = 1,
                       .ignore_eos = true};
    return r;
}

int main(int argc, char **argv)
{
    anv_log_init("eng_engine_check");
    if (argc < 3)
        return 1;
    char err[256] = "";
    eng_engine_opts_t o = {.model_dir = argv[2], .n_blocks = 64, .weight_version = 3};
    const char *backend = getenv("ENG_CHECK_BACKEND");
    if (backend && *backend)
        o.backend = backend, o.cuda_graphs = true;
    eng_engine_t *e = eng_engine_new(&o, err, sizeof(err));
    int n = 0, rc = 1;
    if (!e) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    if (strcmp(argv[1], "reload") == 0 && (argc == 4 || argc == 5)) {
        eng_request_t r = s_greedy("a", 12);
        if (eng_engine_submit(e, &r, err, sizeof(err)) || s_run(e, &n))
            goto out;
        /* a request in flight when the weights change is recomputed under the new ones */
        r = s_greedy("mid", 12);
        if (eng_engine_submit(e, &r, err, sizeof(err)) || eng_engine_step(e) < 0 ||
            eng_engine_step(e) < 0)
            goto out;
        if (eng_engine_load_weights(e, argv[3], 7, err, sizeof(err)))
            goto out;
        r = s_greedy("b", 12);
        if (eng_engine_submit(e, &r, err, sizeof(err)) || s_run(e, &n))
            goto out;
        /* a directory of another shape is refused and the loaded weights stay */
        if (eng_engine_load_weights(e, "/nonexistent", 8, err, sizeof(err)) == 0)
            goto out;
        fprintf(stderr, "refused as expected: %s\n", err);
        if (eng_engine_weight_version(e) != 7)
            goto out;
        /* a checkpoint that passes the config check but not the tensors' is refused before
           anything is written: the weights are still B's */
        if (argc == 5) {
            if (eng_engine_load_weights(e, argv[4], 9, err, sizeof(err)) == 0)
                goto out;
            fprintf(stderr, "broken checkpoint refused as expected: %s\n", err);
        }
        r = s_greedy("c", 12);
        if (eng_engine_weight_version(e) != 7 || eng_engine_submit(e, &r, err, sizeof(err)) ||
            s_run(e, &n))
            goto out;
    } else if (strcmp(argv[1], "cancel") == 0) {
        eng_request_t r1 = s_greedy("keep", 10), r2 = s_greedy("drop", 1000);
        if (eng_engine_submit(e, &r1, err, sizeof(err)) ||
            eng_engine_submit(e, &r2, err, sizeof(err)))
            goto out;
        for (int i = 0; i < 4; i++)
            if (eng_engine_step(e) < 0)
                goto out;
        if (eng_engine_cancel(e, "drop") || eng_engine_cancel(e, "drop") != ANV_ENOTFOUND)
            goto out;
        if (eng_engine_submit(e, &r2, err, sizeof(err))) /* the id is free again */
            goto out;
        if (eng_engine_cancel(e, "drop") || s_run(e, &n))
            goto out;
        eng_engine_stats_t st;
        eng_engine_stats(e, &st);
        if (st.free_blocks != st.total_blocks) /* every block came back */
            goto out;
    } else if (strcmp(argv[1], "cancel_late") == 0) {
        /* seeded samples are the same whatever the batch: run a sampled group of two once,
           pick a token only sample 0 produces, and rerun with it as a stop id, so sample 0
           ends early and deterministically while sample 1 is still decoding */
        enum { LEN = 48 };
        uint64_t seeds[2] = {11, 12};
        eng_request_t r = s_greedy("probe", LEN);
        r.sampling.temperature = 1.0f;
        r.seeds = seeds;
        eng_sample_t *got[2] = {NULL, NULL}, *x;
        if (eng_engine_submit(e, &r, err, sizeof(err)))
            goto out;
        while (!eng_engine_idle(e)) {
            if (eng_engine_step(e) < 0)
                goto out;
            while ((x = eng_engine_pop_finished(e)))
                got[x->index & 1] = x;
        }
        int32_t stop = -1;
        int at = -1;
        for (int i = 2; got[0] && got[1] && i < got[0]->n_tokens && stop < 0; i++) {
            bool seen = false;
            for (int j = 0; j < got[1]->n_tokens && !seen; j++)
                seen = got[1]->tokens[j] == got[0]->tokens[i];
            for (int j = 0; j < i && !seen; j++)
                seen = got[0]->tokens[j] == got[0]->tokens[i];
            if (!seen) {
                stop = got[0]->tokens[i];
                at = i;
            }
        }
        eng_sample_destroy(&got[0]);
        eng_sample_destroy(&got[1]);
        if (stop < 0) {
            snprintf(err, sizeof err, "no token of sample 0 is absent from sample 1");
            goto out;
        }
        fprintf(stderr, "sample 0 stops at token %d (id %d)\n", at, stop);
        r.request_id = "late";
        r.stop_ids = &stop;
        r.n_stop_ids = 1;
        if (eng_engine_submit(e, &r, err, sizeof(err)))
            goto out;
        bool first_done = false;
        for (int steps = 0; !first_done && steps < 4 * LEN; steps++) {
            if (eng_engine_step(e) < 0)
                goto out;
            while ((x = eng_engine_pop_finished(e))) {
                printf("{\"id\":\"%s\",\"index\":%d,\"finish\":\"%s\",\"n\":%d}\n",
                       x->request_id, x->index, eng_finish_name(x->finish), x->n_tokens);
                first_done = first_done || (x->index == 0 && x->finish == ENG_FINISH_EOS);
                n++;
                eng_sample_destroy(&x);
            }
        }
        if (!first_done || n != 1) {
            snprintf(err, sizeof err, "sample 0 did not end alone (%d finished)", n);
            goto out;
        }
        if (eng_engine_cancel(e, "late") || s_run(e, &n))
            goto out;
        eng_engine_stats_t st;
        eng_engine_stats(e, &st);
        if (n != 2 || st.free_blocks != st.total_blocks)
            goto out;
    } else if (strcmp(argv[1], "seeds") == 0) {
        uint64_t dup[3] = {9, 4, 9}, ok[3] = {9, 4, 10};
        eng_request_t r = s_greedy("s", 3);
        r.n = 3;
        r.seeds = dup;
        if (eng_engine_submit(e, &r, err, sizeof(err)) != ANV_ECONFIG)
            goto out;
        fprintf(stderr, "refused as expected: %s\n", err);
        r.seeds = ok;
        if (eng_engine_submit(e, &r, err, sizeof(err)) ||
            eng_engine_submit(e, &r, err, sizeof(err)) != ANV_ECONFIG) /* id in flight */
            goto out;
        if (s_run(e, &n))
            goto out;
    } else {
        goto out;
    }
    printf("ok\n");
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "check failed (%s)\n", err);
    eng_engine_destroy(&e);
    return rc;
}
