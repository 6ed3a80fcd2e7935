/*  test_worker.c - a no-op gen or exec worker built on anvil_broker_client, for tests and
    benchmarks.

    gen: answers every GenUnit at once (or after --sleep-ms) with one Sample per requested
    index ("echo" text, --tokens token ids and logprobs); --gap-ms waits that long before each
    Sample of a unit (a unit's results spread over time, e.g. across a broker restart). exec: answers ExecUnits with
    EXEC_CORRECT when the completion contains "ok", else EXEC_INCORRECT. --fail answers every
    unit with a retryable UnitFailed, --fatal with a non-retryable one. --error-every K makes
    the units of tasks whose index is a multiple of K end badly: gen samples with
    FINISH_ERROR, exec results with no verdict (EXEC_NONE). --model and --caps (comma-separated
    capabilities) go into READY. --log FILE appends one
    line per received unit: "unit <lease> <job> <task> <monotonic ns> <wall ms>", and
    "cancel <job>".
    Units of a cancelled job that are still queued are dropped. WeightsUpdate is answered
    with WeightsLoaded. Runs until SIGINT/SIGTERM; SIGKILL is what the crash tests use.
*/
#include "anv_config.h"
#include "anv_log.h"
#include "anv_msg.h"
#include "anv_time.h"
#include "broker_client.h"

#include <czmq.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    char *endpoint = NULL, *kind = NULL, *id = NULL, *log_path = NULL, *level = NULL;
    char *model = NULL, *caps_s = NULL;
    int64_t slots, sleep_ms, tokens, hb_ms, error_every, gap_ms;
    bool fail = false, fatal = false;
    const anv_cfg_opt_t opts[] = {
        {"endpoint", ANV_CFG_STR, "tcp://127.0.0.1:5556", 0, -1, "broker worker endpoint",
         &endpoint, false},
        {"kind", ANV_CFG_STR, "gen", 0, -1, "gen|exec", &kind, false},
        {"id", ANV_CFG_STR, NULL, 0, -1, "worker id", &id, false},
        {"slots", ANV_CFG_INT, "64", 1, 100000, "credit", &slots, false},
        {"sleep-ms", ANV_CFG_INT, "0", 0, 3600000, "work time per unit", &sleep_ms, false},
        {"tokens", ANV_CFG_INT, "4", 0, 100000, "tokens per sample", &tokens, false},
        {"gap-ms", ANV_CFG_INT, "0", 0, 3600000, "wait before each sample of a unit", &gap_ms,
         false},
        {"heartbeat-ms", ANV_CFG_INT, "1000", 10, 60000, "heartbeat", &hb_ms, false},
        {"fail", ANV_CFG_BOOL, "false", 0, -1, "fail every unit (retryable)", &fail, false},
        {"fatal", ANV_CFG_BOOL, "false", 0, -1, "fail every unit (not retryable)", &fatal,
         false},
        {"log", ANV_CFG_STR, NULL, 0, -1, "unit log file", &log_path, false},
        {"error-every", ANV_CFG_INT, "0", 0, 1000000, "bad results for tasks % K == 0",
         &error_every, false},
        {"model", ANV_CFG_STR, "echo", 0, -1, "model announced in READY", &model, false},
        {"caps", ANV_CFG_STR, "", 0, -1, "capabilities announced in READY (a,b,c)", &caps_s,
         false},
        {"log-level", ANV_CFG_STR, "info", 0, -1, "log level", &level, false},
    };
    size_t n_opts = sizeof opts / sizeof opts[0];
    char err[256];
    anv_log_init("test-worker");
    if (anv_config_load(opts, n_opts, argc, argv, NULL, err, sizeof err) != 0) {
        fprintf(stderr, "test_worker: %s\n", err);
        return 2;
    }
    anv_log_set_level(anv_log_level_parse(level) < 0 ? ANV_LOG_INFO
                                                     : (anv_log_level_t)anv_log_level_parse(level));
    bool gen = strcmp(kind, "exec") != 0;
    FILE *log = log_path && *log_path ? fopen(log_path, "a") : NULL;
    if (log)
        setvbuf(log, NULL, _IOLBF, 0);
    char *caps[16];
    size_t n_caps = 0;
    for (char *tok = strtok(caps_s, ","); tok && n_caps < 16; tok = strtok(NULL, ","))
        caps[n_caps++] = tok;
    broker_client_config_t cfg = {
        .endpoint = endpoint,
        .kind = gen ? ANVIL__WORKER_KIND__WORKER_GEN : ANVIL__WORKER_KIND__WORKER_EXEC,
        .worker_id = id && *id ? id : NULL,
        .gpu_index = -1,
        .gpu_name = "none",
        .model = model,
        .capabilities = (const char *const *)caps,
        .n_capabilities = n_caps,
        .slots = (uint32_t)slots,
        .heartbeat_ms = (int)hb_ms,
    };
    broker_client_t *c = broker_client_new(&cfg);
    if (!c)
        return 1;
    uint32_t *tok = calloc((size_t)tokens + 1, sizeof *tok);
    float *lp = calloc((size_t)tokens + 1, sizeof *lp);
    for (int64_t i = 0; i < tokens; i++) {
        tok[i] = (uint32_t)(i + 3);
        lp[i] = -0.5f;
    }
    zhashx_t *cancelled = zhashx_new();
    broker_client_stats_t st = {0};
    while (!zsys_interrupted) {
        Anvil__Envelope *env = broker_client_recv(c, 200);
        if (!env)
            continue;
        if (env->body_case == ANVIL__ENVELOPE__BODY_CANCEL_UNITS) {
            const char *job = env->cancel_units->job_id ? env->cancel_units->job_id : "";
            zhashx_update(cancelled, job, (void *)1);
            if (log)
                fprintf(log, "cancel %s\n", job);
        } else if (env->body_case == ANVIL__ENVELOPE__BODY_WEIGHTS_UPDATE) {
            Anvil__Envelope out;
            Anvil__WeightsLoaded wl = ANVIL__WEIGHTS_LOADED__INIT;
            anv_msg_init(&out);
            anv_sleep_ms(10);
            wl.version = env->weights_update->version;
            wl.has_ok = wl.has_seconds = 1;
            wl.ok = 1;
            wl.seconds = 0.01;
            wl.worker_id = (char *)broker_client_worker_id(c);
            out.body_case = ANVIL__ENVELOPE__BODY_WEIGHTS_LOADED;
            out.weights_loaded = &wl;
            broker_client_send(c, &out);
            st.weight_version = wl.version;
            broker_client_set_stats(c, &st);
        } else if (env->body_case == ANVIL__ENVELOPE__BODY_GEN_UNIT) {
            Anvil__GenUnit *u = env->gen_unit;
            if (log)
                fprintf(log, "unit %s %s %llu %lld %lld\n", u->lease_id, u->job_id,
                        (unsigned long long)(u->task ? u->task->index : 0),
                        (long long)anv_now_ns(), (long long)anv_wall_ms());
            if (zhashx_lookup(cancelled, u->job_id)) {
                anv_msg_free(&env);
                continue;
            }
            if (sleep_ms)
                anv_sleep_ms(sleep_ms);
            if (fail || fatal) {
                broker_client_send_unit_failed(c, u->lease_id, "test worker fails every unit",
                                               !fatal);
            } else {
                for (size_t i = 0; i < u->n_sample_indices; i++) {
                    if (gap_ms)
                        anv_sleep_ms(gap_ms);
                    Anvil__Sample s = ANVIL__SAMPLE__INIT;
                    char text[128];
                    snprintf(text, sizeof text, "echo %s ok",
                             u->task && u->task->custom_id ? u->task->custom_id : "");
                    s.has_sample_index = s.has_finish_reason = s.has_seed = 1;
                    s.sample_index = u->sample_indices[i];
                    s.text = text;
                    s.finish_reason = ANVIL__FINISH_REASON__FINISH_EOS;
                    if (error_every && u->task && u->task->index % (uint64_t)error_every == 0) {
                        s.finish_reason = ANVIL__FINISH_REASON__FINISH_ERROR;
                        s.error = "test worker: error on purpose";
                    }
                    s.seed = u->base_seed + s.sample_index;
                    s.n_token_ids = s.n_logprobs = (size_t)tokens;
                    s.token_ids = tok;
                    s.logprobs = lp;
                    broker_client_send_gen_result(c, u->lease_id, &s,
                                                  i + 1 == u->n_sample_indices);
                    st.tokens_generated += (uint64_t)tokens;
                }
            }
        } else if (env->body_case == ANVIL__ENVELOPE__BODY_EXEC_UNIT) {
            Anvil__ExecUnit *u = env->exec_unit;
            if (log)
                fprintf(log, "unit %s %s %llu %lld %lld\n", u->lease_id, u->job_id,
                        (unsigned long long)u->task_index, (long long)anv_now_ns(),
                        (long long)anv_wall_ms());
            if (zhashx_lookup(cancelled, u->job_id)) {
                anv_msg_free(&env);
                continue;
            }
            if (sleep_ms)
                anv_sleep_ms(sleep_ms);
            if (fail || fatal) {
                broker_client_send_unit_failed(c, u->lease_id, "test worker fails every unit",
                                               !fatal);
            } else {
                Anvil__ExecResult r = ANVIL__EXEC_RESULT__INIT;
                bool ok = u->completion && strstr(u->completion, "ok");
                r.has_status = r.has_speedup = r.has_reward = 1;
                r.status = ok ? ANVIL__EXEC_STATUS__EXEC_CORRECT : ANVIL__EXEC_STATUS__EXEC_INCORRECT;
                if (error_every && u->task_index % (uint64_t)error_every == 0) {
                    r.status = ANVIL__EXEC_STATUS__EXEC_NONE; /* no verdict */
                    ok = false;
                }
                r.speedup = ok ? 1.5 : 0;
                r.reward = ok ? 2.5 : 0;
                broker_client_send_exec_done(c, u->lease_id, &r);
                st.evals_done++;
            }
        }
        broker_client_set_stats(c, &st);
        anv_msg_free(&env);
    }
    broker_client_destroy(&c);
    zhashx_destroy(&cancelled);
    free(tok);
    free(lp);
    if (log)
        fclose(log);
    anv_config_free(opts, n_opts, NULL);
    return 0;
}
