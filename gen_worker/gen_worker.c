/*  gen_worker.c - the gen worker loop: broker units in, engine steps, samples out.

    State: a small table of units (at most `slots`), each remembering its lease, job, task,
    which group sample each engine sample index stands for, and how many are still running;
    plus a backlog of units received while a FINISH-policy weight update waits for the engine
    to empty. The engine request id is the lease id, so cancel and finish map back directly.

    The loop: take every waiting broker message (blocking briefly only when the engine is idle),
    run one engine step, send every finished sample, publish counters to the heartbeat (free KV
    and the engine's queue, by which the broker paces its units; a heartbeat goes at once when
    the queue runs empty, s_publish). Engine failures are not survivable in-process (device
    state unknown): every held lease is handed back, retryable, and the loop returns an error
    so the supervisor restarts the worker.
*/
#include "gen_worker.h"

#include "anv_error.h"
#include "anv_log.h"
#include "anv_msg.h"
#include "anv_time.h"
#include "broker_client.h"
#include "eng_chat.h"
#include "eng_engine.h"
#include "eng_sampler.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    bool used;
    char lease_id[ENG_REQUEST_ID_MAX];
    char *job_id;
    char *custom_id;
    uint64_t task_index;
    uint32_t attempt;
    uint32_t *indices;       /* engine sample i = group sample indices[i] */
    int n;
    int remaining;
    int32_t *prompt_ids;     /* what the prompt encoded to (returned with every sample) */
    int n_prompt;
    int n_resume;            /* tokens of an aborted sample this unit continues */
    int64_t received_ms;
    bool cancelled;
} s_unit_t;

struct gen_worker_t {
    gen_worker_config_t cfg;
    eng_engine_t *eng;
    broker_client_t *bc;
    s_unit_t *units;
    int n_units;             /* table size (= slots) */
    Anvil__Envelope **backlog;
    int n_backlog, cap_backlog;
    volatile sig_atomic_t draining;
    /* a weight update waiting for in-flight work (FINISH policy) */
    bool weights_pending;
    uint64_t pending_version;
    char *pending_dir;
    uint64_t tokens_generated;
    bool refill; /* units arrived or samples queued since the queue was last seen empty */
    char worker_id[128];
};

/* ---- helpers ----------------------------------------------------------------------------- */

static s_unit_t *s_unit_find(gen_worker_t *w, const char *lease_id)
{
    for (int i = 0; i < w->n_units; i++)
        if (w->units[i].used && !strcmp(w->units[i].lease_id, lease_id))
            return &w->units[i];
    return NULL;
}

static int s_units_in_flight(const gen_worker_t *w)
{
    int n = 0;
    for (int i = 0; i < w->n_units; i++)
        n += w->units[i].used;
    return n;
}

static void s_unit_release(s_unit_t *u)
{
    free(u->job_id);
    free(u->custom_id);
    free(u->indices);
    free(u->prompt_ids);
    memset(u, 0, sizeof *u);
}

static Anvil__FinishReason s_finish(eng_finish_t f)
{
    switch (f) {
    case ENG_FINISH_EOS:
        return ANVIL__FINISH_REASON__FINISH_EOS;
    case ENG_FINISH_STOP:
        return ANVIL__FINISH_REASON__FINISH_STOP;
    case ENG_FINISH_LENGTH:
        return ANVIL__FINISH_REASON__FINISH_LENGTH;
    case ENG_FINISH_CONTEXT:
        return ANVIL__FINISH_REASON__FINISH_CONTEXT;
    case ENG_FINISH_CANCELLED:
        return ANVIL__FINISH_REASON__FINISH_CANCELLED;
    default:
        return ANVIL__FINISH_REASON__FINISH_NONE;
    }
}

/* Sends one sample of unit u. `es` may be NULL for an error sample (error text given). */
static void s_send_sample(gen_worker_t *w, s_unit_t *u, uint32_t sample_index,
                          const eng_sample_t *es, Anvil__FinishReason finish, const char *error,
                          bool last)
{
    Anvil__Sample s = ANVIL__SAMPLE__INIT;
    Anvil__SampleTimings tm = ANVIL__SAMPLE_TIMINGS__INIT;
    char *text = NULL;
    s.job_id = u->job_id;
    s.has_task_index = 1;
    s.task_index = u->task_index;
    s.has_sample_index = 1;
    s.sample_index = sample_index;
    s.custom_id = u->custom_id;
    s.n_prompt_token_ids = (size_t)u->n_prompt;
    s.prompt_token_ids = (uint32_t *)u->prompt_ids; /* ids are >= 0: same bits */
    s.has_n_prompt_tokens = 1; /* the counts survive a results page without the ids */
    s.n_prompt_tokens = (uint32_t)u->n_prompt;
    s.has_finish_reason = 1;
    s.finish_reason = finish;
    s.error = (char *)error;
    s.worker_id = w->worker_id;
    s.has_attempt = 1;
    s.attempt = u->attempt;
    s.has_weight_version = 1;
    s.weight_version = eng_engine_weight_version(w->eng);
    if (es) {
        s.n_token_ids = (size_t)es->n_tokens;
        s.token_ids = (uint32_t *)es->tokens;
        s.has_n_tokens = 1;
        s.n_tokens = (uint32_t)es->n_tokens;
        s.n_logprobs = (size_t)es->n_tokens;
        s.logprobs = es->logprobs;
        /* a string field must be UTF-8; the exact bytes stay recoverable from the ids */
        text = eng_utf8_lossy(es->text ? es->text : "", es->text_len);
        s.text = text;
        /* the version that produced the first token: a sample that straddles a PAUSE update
           is as old as its oldest token */
        s.weight_version = es->weight_version_first;
        s.has_seed = 1;
        s.seed = es->seed;
    }
    tm.has_total_ms = 1;
    tm.total_ms = (double)(anv_now_ms() - u->received_ms);
    s.timings = &tm;
    int rc = broker_client_send_gen_result(w->bc, u->lease_id, &s, last);
    free(text);
    if (rc != 0)
        ANV_JERROR(u->job_id, "cannot queue sample %u of '%s': %s", sample_index, u->lease_id,
                   anv_strerror(rc));
}

/* Every sample of the unit as an error (prompt too long, bad parameters): not retryable,
   the same input fails the same way anywhere. */
static void s_fail_unit_samples(gen_worker_t *w, s_unit_t *u, Anvil__FinishReason finish,
                                const char *error)
{
    for (int i = 0; i < u->n; i++)
        s_send_sample(w, u, u->indices[i], NULL, finish, error, i == u->n - 1);
    s_unit_release(u);
}

/* ---- units -------------------------------------------------------------------------------- */

static void s_sampling_from(const Anvil__SamplingParams *sp, eng_sampling_t *out)
{
    out->temperature = sp && sp->has_temperature ? sp->temperature : 1.0f;
    out->top_k = sp && sp->has_top_k ? sp->top_k : 0;
    out->top_p = sp && sp->has_top_p ? sp->top_p : 1.0f;
    out->min_p = sp && sp->has_min_p ? sp->min_p : 0.0f;
    out->n_top_logprobs = sp && sp->has_top_logprobs ? (int)sp->top_logprobs : 0;
}

/* Encodes the unit's prompt: chat messages through the template, or the prompt text raw or
   as one user message. */
static int s_encode(gen_worker_t *w, const Anvil__GenUnit *gu, eng_ids_t *ids, char *err,
                    size_t errlen)
{
    const Anvil__Task *t = gu->task;
    bool chat = gu->has_chat ? gu->chat : true;
    int rc;
    if (t && t->n_messages > 0) {
        eng_chat_t chat_t;
        eng_chat_init(&chat_t, eng_engine_tokenizer(w->eng));
        eng_chat_msg_t *msgs = calloc(t->n_messages, sizeof *msgs);
        if (!msgs)
            return -ENOMEM;
        for (size_t i = 0; i < t->n_messages; i++) {
            msgs[i].role = t->messages[i]->role;
            msgs[i].content = t->messages[i]->content;
        }
        rc = eng_chat_render(&chat_t, eng_engine_tokenizer(w->eng), msgs, (int)t->n_messages,
                             true, ids);
        free(msgs);
        if (rc != 0)
            snprintf(err, errlen, "cannot render the chat messages with the %s template: %s",
                     eng_chat_kind_name(chat_t.kind), anv_strerror(rc));
        return rc;
    }
    if (!t || !t->prompt) {
        snprintf(err, errlen, "the task has neither a prompt nor messages");
        return ANV_EFORMAT;
    }
    rc = eng_engine_encode_prompt(w->eng, t->prompt, chat, ids);
    if (rc != 0)
        snprintf(err, errlen, "cannot encode the prompt: %s", anv_strerror(rc));
    return rc;
}

static void s_start_unit(gen_worker_t *w, Anvil__GenUnit *gu)
{
    s_unit_t *u = NULL;
    for (int i = 0; i < w->n_units && !u; i++)
        if (!w->units[i].used)
            u = &w->units[i];
    if (!u || strlen(gu->lease_id) >= ENG_REQUEST_ID_MAX) {
        /* more units than slots (the broker over-sent) or an absurd lease id: hand it back */
        broker_client_send_unit_failed(w->bc, gu->lease_id,
                                       u ? "lease id too long" : "worker has no free slot", !u);
        return;
    }
    memset(u, 0, sizeof *u);
    u->used = true;
    w->refill = true; /* ask for more once its samples are in (s_publish) */
    snprintf(u->lease_id, sizeof u->lease_id, "%s", gu->lease_id);
    u->job_id = strdup(gu->job_id);
    u->custom_id = gu->task && gu->task->custom_id ? strdup(gu->task->custom_id) : NULL;
    u->task_index = gu->task && gu->task->has_index ? gu->task->index : 0;
    u->attempt = gu->has_attempt ? gu->attempt : 0;
    u->received_ms = anv_now_ms();
    u->n = gu->n_sample_indices ? (int)gu->n_sample_indices : 1;
    u->indices = calloc((size_t)u->n, sizeof *u->indices);
    if (!u->job_id || !u->indices) {
        broker_client_send_unit_failed(w->bc, gu->lease_id, "out of memory", true);
        s_unit_release(u);
        return;
    }
    for (int i = 0; i < u->n; i++)
        u->indices[i] = gu->n_sample_indices ? gu->sample_indices[i] : 0;
    u->remaining = u->n;

    char err[256] = "";
    eng_ids_t ids = {0};
    int rc = s_encode(w, gu, &ids, err, sizeof err);
    if (rc != 0) {
        eng_ids_release(&ids);
        ANV_JWARN(u->job_id, "unit '%s': %s", u->lease_id, err);
        s_fail_unit_samples(w, u, ANVIL__FINISH_REASON__FINISH_ERROR, err);
        return;
    }
    u->n_prompt = ids.n;
    u->prompt_ids = malloc(sizeof(int32_t) * (size_t)(ids.n ? ids.n : 1));
    if (u->prompt_ids)
        memcpy(u->prompt_ids, ids.v, sizeof(int32_t) * (size_t)ids.n);
    /* continuing an aborted sample: its tokens so far extend the prompt (the unit's own list,
       else the task's, which travels inside the unit as the client submitted it) */
    size_t n_resume = gu->n_resume_token_ids;
    const uint32_t *resume = gu->resume_token_ids;
    if (!n_resume && gu->task && gu->task->n_resume_token_ids) {
        n_resume = gu->task->n_resume_token_ids;
        resume = gu->task->resume_token_ids;
    }
    for (size_t i = 0; i < n_resume; i++)
        eng_ids_push(&ids, (int32_t)resume[i]);
    u->n_resume = (int)n_resume;

    const Anvil__SamplingParams *sp = gu->sampling;
    eng_request_t req = {0};
    req.request_id = u->lease_id;
    req.prompt_ids = ids.v;
    req.n_prompt_ids = ids.n;
    req.n = u->n;
    s_sampling_from(sp, &req.sampling);
    int max_tokens = sp && sp->has_max_tokens ? (int)sp->max_tokens : w->cfg.default_max_tokens;
    max_tokens -= u->n_resume;
    req.max_tokens = max_tokens > 0 ? max_tokens : 1;
    uint64_t *seeds = NULL;
    bool seeded = gu->has_base_seed || (sp && sp->has_seed);
    if (seeded) {
        uint64_t base = gu->has_base_seed ? gu->base_seed : sp->seed;
        seeds = calloc((size_t)u->n, sizeof *seeds);
        for (int i = 0; seeds && i < u->n; i++)
            seeds[i] = eng_seed_for_sample(base, u->indices[i]);
        req.seeds = seeds;
    }
    req.stop = sp ? (const char *const *)sp->stop : NULL;
    req.n_stop = sp ? (int)sp->n_stop : 0;
    req.stop_ids = sp ? (const int32_t *)sp->stop_token_ids : NULL;
    req.n_stop_ids = sp ? (int)sp->n_stop_token_ids : 0;
    rc = eng_engine_submit(w->eng, &req, err, sizeof err);
    free(seeds);
    eng_ids_release(&ids);
    if (rc != 0) {
        ANV_JWARN(u->job_id, "unit '%s' refused by the engine: %s", u->lease_id, err);
        s_fail_unit_samples(w, u,
                            rc == ANV_ETOOBIG ? ANVIL__FINISH_REASON__FINISH_CONTEXT
                                              : ANVIL__FINISH_REASON__FINISH_ERROR,
                            err);
        return;
    }
    ANV_JDEBUG(u->job_id, "unit '%s': %d samples of a %d-token prompt", u->lease_id, u->n,
               u->n_prompt);
}

static void s_cancel(gen_worker_t *w, const Anvil__CancelUnits *cu)
{
    for (int i = 0; i < w->n_units; i++) {
        s_unit_t *u = &w->units[i];
        if (!u->used)
            continue;
        bool hit = false;
        if (cu->n_lease_ids) {
            for (size_t k = 0; k < cu->n_lease_ids && !hit; k++)
                hit = !strcmp(cu->lease_ids[k], u->lease_id);
        } else {
            hit = cu->job_id && !strcmp(cu->job_id, u->job_id);
        }
        if (hit) {
            /* its samples are dropped as they come out, or with keep_partial sent as they
               are (FINISH_CANCELLED, the tokens so far) */
            u->cancelled = !(cu->has_keep_partial && cu->keep_partial);
            eng_engine_cancel(w->eng, u->lease_id);
            ANV_JINFO(u->job_id, "unit '%s' cancelled%s", u->lease_id,
                      u->cancelled ? "" : " (keeping its partial samples)");
        }
    }
    /* units of the job still in the backlog never started */
    for (int i = 0; i < w->n_backlog; i++) {
        Anvil__GenUnit *gu = w->backlog[i]->gen_unit;
        bool hit = cu->n_lease_ids == 0 && cu->job_id && !strcmp(cu->job_id, gu->job_id);
        for (size_t k = 0; k < cu->n_lease_ids && !hit; k++)
            hit = !strcmp(cu->lease_ids[k], gu->lease_id);
        if (hit) {
            if (cu->has_keep_partial && cu->keep_partial) /* the broker waits for it */
                broker_client_send_unit_failed(w->bc, gu->lease_id, "cancelled before it started",
                                               true);
            anv_msg_free(&w->backlog[i]);
            w->backlog[i--] = w->backlog[--w->n_backlog];
        }
    }
}

/* ---- finished samples --------------------------------------------------------------------- */

static void s_collect(gen_worker_t *w, bool aborting)
{
    eng_sample_t *es;
    while ((es = eng_engine_pop_finished(w->eng))) {
        s_unit_t *u = s_unit_find(w, es->request_id);
        if (!u || es->index < 0 || es->index >= u->n) {
            eng_sample_destroy(&es);
            continue;
        }
        w->tokens_generated += (uint64_t)es->n_tokens;
        u->remaining--;
        if (!u->cancelled) {
            Anvil__FinishReason f = s_finish(es->finish);
            if (aborting && es->finish == ENG_FINISH_CANCELLED)
                f = ANVIL__FINISH_REASON__FINISH_ABORTED;
            s_send_sample(w, u, u->indices[es->index], es, f, NULL, u->remaining == 0);
        }
        eng_sample_destroy(&es);
        if (u->remaining == 0)
            s_unit_release(u);
    }
}

/* ---- weights ------------------------------------------------------------------------------ */

static void s_load_weights(gen_worker_t *w, uint64_t version, const char *dir)
{
    char err[256] = "";
    int64_t t0 = anv_now_ns();
    int rc = eng_engine_load_weights(w->eng, dir, version, err, sizeof err);
    double secs = (double)(anv_now_ns() - t0) / 1e9;
    Anvil__Envelope env;
    anv_msg_init(&env);
    Anvil__WeightsLoaded wl = ANVIL__WEIGHTS_LOADED__INIT;
    wl.version = rc == 0 ? version : eng_engine_weight_version(w->eng);
    wl.has_seconds = 1;
    wl.seconds = secs;
    wl.has_ok = 1;
    wl.ok = rc == 0;
    wl.error = rc == 0 ? NULL : err;
    wl.worker_id = w->worker_id;
    env.body_case = ANVIL__ENVELOPE__BODY_WEIGHTS_LOADED;
    env.weights_loaded = &wl;
    broker_client_send(w->bc, &env);
    if (rc == 0)
        ANV_INFO("weights version %llu loaded from '%s' in %.3f s", (unsigned long long)version,
                 dir, secs);
    else
        ANV_ERROR("cannot load weights version %llu from '%s': %s", (unsigned long long)version,
                  dir, err);
}

static void s_on_weights(gen_worker_t *w, const Anvil__WeightsUpdate *wu)
{
    Anvil__WeightsPolicy policy = wu->has_policy ? wu->policy : ANVIL__WEIGHTS_POLICY__WEIGHTS_FINISH;
    ANV_INFO("weights update to version %llu from '%s' (policy %d)",
             (unsigned long long)wu->version, wu->checkpoint_dir, (int)policy);
    if (policy == ANVIL__WEIGHTS_POLICY__WEIGHTS_FINISH && s_units_in_flight(w) > 0) {
        free(w->pending_dir);
        w->pending_dir = strdup(wu->checkpoint_dir);
        w->pending_version = wu->version;
        w->weights_pending = w->pending_dir != NULL;
        return;
    }
    if (policy == ANVIL__WEIGHTS_POLICY__WEIGHTS_ABORT) {
        for (int i = 0; i < w->n_units; i++)
            if (w->units[i].used)
                eng_engine_cancel(w->eng, w->units[i].lease_id);
        s_collect(w, true);
    }
    s_load_weights(w, wu->version, wu->checkpoint_dir);
}

/* ---- the loop ----------------------------------------------------------------------------- */

static void s_handle(gen_worker_t *w, Anvil__Envelope *env)
{
    switch (env->body_case) {
    case ANVIL__ENVELOPE__BODY_GEN_UNIT:
        if (w->draining) {
            broker_client_hand_back(w->bc, env->gen_unit->lease_id, "worker draining");
        } else if (w->weights_pending) {
            if (w->n_backlog == w->cap_backlog) {
                int cap = w->cap_backlog ? w->cap_backlog * 2 : 16;
                Anvil__Envelope **b = realloc(w->backlog, sizeof *b * (size_t)cap);
                if (!b) {
                    broker_client_send_unit_failed(w->bc, env->gen_unit->lease_id,
                                                   "out of memory", true);
                    break;
                }
                w->backlog = b;
                w->cap_backlog = cap;
            }
            w->backlog[w->n_backlog++] = env;
            return; /* kept */
        } else {
            s_start_unit(w, env->gen_unit);
        }
        break;
    case ANVIL__ENVELOPE__BODY_CANCEL_UNITS:
        s_cancel(w, env->cancel_units);
        break;
    case ANVIL__ENVELOPE__BODY_WEIGHTS_UPDATE:
        s_on_weights(w, env->weights_update);
        break;
    default:
        ANV_DEBUG("ignoring '%s' from the broker", anv_msg_body_name(env));
        break;
    }
    anv_msg_free(&env);
}

/* Sets the heartbeat's counters (force: the periodic update). When the engine's queue has
   run empty since units arrived or samples queued, a heartbeat goes now, so that the broker
   (which sends while the queue is short) refills it at once rather than a second later. */
static void s_publish(gen_worker_t *w, bool force)
{
    eng_engine_stats_t st;
    eng_engine_stats(w->eng, &st);
    /* samples held without KV: the engine's queue, plus units parked during a weight update */
    uint32_t q = (uint32_t)st.queued + (uint32_t)w->n_backlog;
    if (q > 0)
        w->refill = true;
    bool emptied = q == 0 && w->refill;
    if (!force && !emptied)
        return;
    if (emptied)
        w->refill = false;
    broker_client_stats_t bs = {
        .tokens_generated = w->tokens_generated,
        .free_kv_tokens = (uint64_t)st.free_blocks * (uint64_t)st.block_size,
        .weight_version = eng_engine_weight_version(w->eng),
        .has_queued = true,
        .queued_samples = q,
    };
    broker_client_set_stats(w->bc, &bs);
    if (emptied)
        broker_client_heartbeat_now(w->bc);
}

/* Hands back every lease still held (retryable): engine failure or the end of a drain. */
/* Ends every unit held. `own`: for the worker's own reasons (shutdown), so the broker
   charges no attempt; else a failure of the units (an engine failure). */
static void s_give_back(gen_worker_t *w, const char *lease_id, const char *why, bool own)
{
    if (own)
        broker_client_hand_back(w->bc, lease_id, why);
    else
        broker_client_send_unit_failed(w->bc, lease_id, why, true);
}

static void s_hand_back_all(gen_worker_t *w, const char *why, bool own)
{
    for (int i = 0; i < w->n_units; i++) {
        s_unit_t *u = &w->units[i];
        if (!u->used)
            continue;
        eng_engine_cancel(w->eng, u->lease_id);
        if (!u->cancelled)
            s_give_back(w, u->lease_id, why, own);
        s_unit_release(u);
    }
    eng_sample_t *es;
    while ((es = eng_engine_pop_finished(w->eng)))
        eng_sample_destroy(&es);
    for (int i = 0; i < w->n_backlog; i++) {
        s_give_back(w, w->backlog[i]->gen_unit->lease_id, why, own);
        anv_msg_free(&w->backlog[i]);
    }
    w->n_backlog = 0;
}

int gen_worker_run(gen_worker_t *self)
{
    gen_worker_t *w = self;
    int64_t last_publish = 0, drain_deadline = 0;
    int rc = 0;
    for (;;) {
        if (w->draining && !drain_deadline) {
            drain_deadline = anv_now_ms() + w->cfg.grace_ms;
            broker_client_drain(w->bc);
            ANV_INFO("draining: %d units in flight, grace %lld ms", s_units_in_flight(w),
                     (long long)w->cfg.grace_ms);
            for (int i = 0; i < w->n_backlog; i++) {
                broker_client_hand_back(w->bc, w->backlog[i]->gen_unit->lease_id,
                                        "worker draining");
                anv_msg_free(&w->backlog[i]);
            }
            w->n_backlog = 0;
        }
        bool idle = eng_engine_idle(w->eng);
        Anvil__Envelope *env = broker_client_recv(w->bc, idle ? 50 : 0);
        while (env) {
            s_handle(w, env);
            env = broker_client_recv(w->bc, 0);
        }
        if (!eng_engine_idle(w->eng)) {
            int n = eng_engine_step(w->eng);
            if (n < 0) {
                ANV_ERROR("engine step failed: %s; handing back every lease", anv_strerror(n));
                s_hand_back_all(w, "engine failure on the worker", false);
                rc = n;
                break;
            }
        }
        s_collect(w, false);
        if (w->weights_pending && s_units_in_flight(w) == 0) {
            w->weights_pending = false;
            s_load_weights(w, w->pending_version, w->pending_dir);
            free(w->pending_dir);
            w->pending_dir = NULL;
            int n = w->n_backlog;
            w->n_backlog = 0;
            for (int i = 0; i < n; i++)
                s_handle(w, w->backlog[i]);
        }
        if (anv_now_ms() - last_publish >= 200) {
            s_publish(w, true);
            last_publish = anv_now_ms();
        } else {
            s_publish(w, false);
        }
        /* a SIGTERM during this pass set draining after the deadline was due: the grace
           period starts at the top of the next pass, not here */
        if (w->draining && drain_deadline) {
            if (s_units_in_flight(w) == 0)
                break;
            if (anv_now_ms() >= drain_deadline) {
                ANV_WARN("grace period over: handing back %d units", s_units_in_flight(w));
                s_hand_back_all(w, "worker shut down before finishing", true);
                break;
            }
        }
    }
    s_publish(w, true);
    return rc;
}

void gen_worker_drain(gen_worker_t *self)
{
    if (self)
        self->draining = 1;
}

gen_worker_t *gen_worker_new(const gen_worker_config_t *cfg)
{
    gen_worker_t *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->cfg = *cfg;
    char err[512] = "";
    eng_engine_opts_t eo = {
        .model_dir = cfg->model_dir,
        .backend = cfg->backend,
        .n_threads = cfg->n_threads,
        .kv_bytes = cfg->kv_mb > 0 ? (size_t)cfg->kv_mb << 20 : 0,
        .kv_dtype = cfg->kv_dtype,
        .max_batch_tokens = cfg->max_batch_tokens,
        .max_seqs = cfg->max_seqs,
        .weight_version = cfg->weight_version,
        .cuda_graphs = cfg->cuda_graphs,
    };
    int64_t t0 = anv_now_ms();
    w->eng = eng_engine_new(&eo, err, sizeof err);
    if (!w->eng) {
        ANV_ERROR("cannot start the engine on '%s': %s", cfg->model_dir ? cfg->model_dir : "",
                  err);
        goto fail;
    }
    eng_engine_stats_t st;
    eng_engine_stats(w->eng, &st);
    /* slots by default: on a device as many units as the engine decodes sequences at once, so
       that n = 1 jobs fill its batch (units of n samples queue in the engine, and the broker
       offers no more than the free KV holds); the CPU keeps a small table */
    w->n_units = cfg->slots > 0                                 ? cfg->slots
                 : cfg->backend && !strcmp(cfg->backend, "cpu") ? GEN_WORKER_HOST_SLOTS
                                                                : st.max_seqs;
    w->units = calloc((size_t)w->n_units, sizeof *w->units);
    if (!w->units)
        goto fail;
    ANV_INFO("engine ready in %lld ms: backend %s, %d KV blocks of %d tokens (%lld tokens), "
             "%d slots, %d sequences at once, graphs %s",
             (long long)(anv_now_ms() - t0), cfg->backend, st.total_blocks, st.block_size,
             (long long)st.total_blocks * st.block_size, w->n_units, st.max_seqs,
             cfg->cuda_graphs ? "on" : "off");
    const char *caps[] = {"generate", "chat", "logprobs", "weights-update"};
    broker_client_config_t bc = {
        .endpoint = cfg->broker,
        .kind = ANVIL__WORKER_KIND__WORKER_GEN,
        .worker_id = cfg->worker_id,
        .gpu_index = cfg->gpu_index,
        .gpu_name = cfg->gpu_index >= 0 ? "cuda" : "cpu",
        .model = cfg->model_dir,
        .weight_version = cfg->weight_version,
        .slots = (uint32_t)w->n_units,
        .kv_tokens = (uint64_t)st.total_blocks * (uint64_t)st.block_size,
        .capabilities = caps,
        .n_capabilities = sizeof caps / sizeof *caps,
        .curve_secret = cfg->curve_secret,
        .curve_server = cfg->curve_server,
        .ready_file = cfg->ready_file,
    };
    w->bc = broker_client_new(&bc);
    if (!w->bc)
        goto fail;
    snprintf(w->worker_id, sizeof w->worker_id, "%s", broker_client_worker_id(w->bc));
    return w;
fail:
    gen_worker_destroy(&w);
    return NULL;
}

void gen_worker_destroy(gen_worker_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    gen_worker_t *w = *self_p;
    broker_client_destroy(&w->bc); /* flushes queued results, then DISCONNECT */
    for (int i = 0; w->units && i < w->n_units; i++)
        if (w->units[i].used)
            s_unit_release(&w->units[i]);
    for (int i = 0; i < w->n_backlog; i++)
        anv_msg_free(&w->backlog[i]);
    free(w->backlog);
    free(w->units);
    free(w->pending_dir);
    eng_engine_destroy(&w->eng);
    free(w);
    *self_p = NULL;
}
