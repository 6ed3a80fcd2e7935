/*  exec_serve.c - broker loop of the exec worker: ExecUnit in, score, ExecDone out.

    The loop is deliberately simple: the scorer is single-threaded and one evaluation per GPU
    runs at a time, so the main thread blocks in exec_scorer_score() while the broker client's
    thread heartbeats. Before each evaluation the loop drains every waiting message, so cancels
    and drain requests that arrived meanwhile take effect before the next unit starts.
*/
#include "exec_serve.h"

#include "anv_error.h"
#include "anv_log.h"
#include "anv_msg.h"
#include "anv_time.h"
#include "broker_client.h"
#include "exec_result.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define S_QUEUE_MAX 64

typedef struct {
    Anvil__Envelope *q[S_QUEUE_MAX];
    int n;
} s_queue_t;

/* The harness reads TritonBench tasks as one file: reference, a '#' separator line, test. */
static char *s_task_source(const Anvil__TaskRef *ref, const char *kind)
{
    const char *code = ref->reference_code ? ref->reference_code : "";
    if (strcmp(kind, "kernelbench") == 0 || !ref->test_code)
        return strdup(code);
    static const char sep[] = "\n##################################################\n";
    size_t n = strlen(code) + sizeof sep + strlen(ref->test_code) + 1;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%s%s%s", code, sep, ref->test_code);
    return s;
}

static void s_score_unit(exec_scorer_t *sc, broker_client_t *bc, const Anvil__ExecUnit *u,
                         const exec_spec_t *base, const char *worker_id, uint64_t *evals)
{
    const Anvil__TaskRef *ref = u->ref;
    Anvil__TaskKind k = ref && ref->has_kind ? ref->kind : ANVIL__TASK_KIND__TASK_KIND_NONE;
    if (u->scoring && u->scoring->has_kind && u->scoring->kind != ANVIL__TASK_KIND__TASK_KIND_NONE)
        k = u->scoring->kind;
    const char *kind = exec_task_kind_name(k);
    if (!ref || !kind || !ref->reference_code || !*ref->reference_code) {
        ANV_JWARN(u->job_id, "unit '%s' has no scorable task (kind %d)", u->lease_id, (int)k);
        broker_client_send_unit_failed(bc, u->lease_id,
                                       "the task has no reference to score against", false);
        return;
    }
    char *source = s_task_source(ref, kind);
    if (!source) {
        broker_client_send_unit_failed(bc, u->lease_id, "out of memory", true);
        return;
    }
    exec_spec_t spec = *base;
    if (u->scoring)
        exec_spec_from_proto(&spec, u->scoring);
    exec_task_t t = {.kind = kind, .name = ref->name ? ref->name : "task", .source = source,
                     .globals = NULL};
    exec_result_t r;
    int64_t t0 = anv_now_ms();
    int rc = exec_scorer_score(sc, &t, u->completion ? u->completion : "", &spec, &r);
    (*evals)++;
    if (rc != 0) {
        /* the reference itself failed, or no interpreter could start: not the candidate's
           fault; the broker retries elsewhere and dead-letters after max attempts */
        ANV_JWARN(u->job_id, "unit '%s' could not be scored: %s", u->lease_id, r.error);
        broker_client_send_unit_failed(bc, u->lease_id, r.error, true);
    } else {
        Anvil__ExecResult pb;
        if (exec_result_to_proto(&r, &pb) == 0) {
            /* borrowed for the send: exec_result_proto_free frees only what to_proto made
               (strdup'ed copies here leaked two strings per scored unit, found by ASan) */
            pb.job_id = (char *)u->job_id;
            pb.has_task_index = 1;
            pb.task_index = u->has_task_index ? u->task_index : 0;
            pb.has_sample_index = 1;
            pb.sample_index = u->has_sample_index ? u->sample_index : 0;
            pb.worker_id = (char *)worker_id;
            pb.has_attempt = 1;
            pb.attempt = u->has_attempt ? u->attempt : 0;
            broker_client_send_exec_done(bc, u->lease_id, &pb);
            pb.job_id = pb.worker_id = NULL;
            exec_result_proto_free(&pb);
        } else {
            broker_client_send_unit_failed(bc, u->lease_id, "cannot encode the result", true);
        }
        ANV_JINFO(u->job_id, "unit '%s': %s reward %.3f speedup %.3f in %lld ms", u->lease_id,
                  exec_status_name(r.status), r.reward, r.speedup,
                  (long long)(anv_now_ms() - t0));
    }
    exec_result_release(&r);
    free(source);
}

static void s_take(broker_client_t *bc, s_queue_t *q, Anvil__Envelope *env, bool draining)
{
    if (env->body_case == ANVIL__ENVELOPE__BODY_EXEC_UNIT) {
        if (draining || q->n == S_QUEUE_MAX) {
            broker_client_hand_back(bc, env->exec_unit->lease_id,
                                    draining ? "worker draining" : "worker queue full");
            anv_msg_free(&env);
        } else {
            q->q[q->n++] = env;
        }
        return;
    }
    if (env->body_case == ANVIL__ENVELOPE__BODY_CANCEL_UNITS) {
        const Anvil__CancelUnits *cu = env->cancel_units;
        for (int i = 0; i < q->n; i++) {
            const Anvil__ExecUnit *u = q->q[i]->exec_unit;
            bool hit = !cu->n_lease_ids && cu->job_id && !strcmp(cu->job_id, u->job_id);
            for (size_t k = 0; k < cu->n_lease_ids && !hit; k++)
                hit = !strcmp(cu->lease_ids[k], u->lease_id);
            if (hit) {
                anv_msg_free(&q->q[i]);
                q->q[i--] = q->q[--q->n];
            }
        }
    }
    anv_msg_free(&env);
}

int exec_serve_run(exec_scorer_t *sc, const exec_serve_cfg_t *cfg, const exec_spec_t *base,
                   volatile sig_atomic_t *stop)
{
    const char *caps[] = {"kernelbench", "tritonbench-g", "tritonbench-t",
                          strcmp(cfg->device, "cuda") ? "triton-interpret" : "cuda"};
    broker_client_config_t bcfg = {
        .endpoint = cfg->broker,
        .kind = ANVIL__WORKER_KIND__WORKER_EXEC,
        .worker_id = cfg->worker_id,
        .gpu_index = cfg->gpu_index,
        .gpu_name = cfg->device,
        .slots = 1,
        .capabilities = caps,
        .n_capabilities = 4,
        .curve_secret = cfg->curve_secret,
        .curve_server = cfg->curve_server,
        .ready_file = cfg->ready_file,
    };
    broker_client_t *bc = broker_client_new(&bcfg);
    if (!bc)
        return 1;
    const char *wid = broker_client_worker_id(bc);
    ANV_INFO("serving broker '%s' as '%s' (%s, sandbox %s)", cfg->broker, wid, cfg->device,
             exec_scorer_sandbox_mode(sc));
    s_queue_t q = {0};
    uint64_t evals = 0;
    while (!*stop || q.n > 0) {
        Anvil__Envelope *env = broker_client_recv(bc, q.n ? 0 : 200);
        while (env) {
            s_take(bc, &q, env, *stop != 0);
            env = broker_client_recv(bc, 0);
        }
        if (*stop) {
            broker_client_drain(bc);
            /* hand back what has not started; the unit in progress (if any) already ended */
            for (int i = 0; i < q.n; i++) {
                broker_client_hand_back(bc, q.q[i]->exec_unit->lease_id, "worker draining");
                anv_msg_free(&q.q[i]);
            }
            q.n = 0;
            break;
        }
        if (q.n == 0)
            continue;
        Anvil__Envelope *head = q.q[0];
        memmove(q.q, q.q + 1, sizeof *q.q * (size_t)(--q.n));
        s_score_unit(sc, bc, head->exec_unit, base, wid, &evals);
        anv_msg_free(&head);
        broker_client_stats_t st = {.evals_done = evals};
        broker_client_set_stats(bc, &st);
    }
    broker_client_destroy(&bc);
    ANV_INFO("exec worker stopped after %llu evaluations", (unsigned long long)evals);
    return 0;
}
