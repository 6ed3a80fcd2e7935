/*  main.c - anvil-gen-worker: configuration, then one gen worker (or one per GPU).

    `--gpus all|LIST` makes this process a supervisor of one child per GPU (common/
    anv_supervisor.h), each started as `anvil-gen-worker ... --gpu 0` with its own
    CUDA_VISIBLE_DEVICES; otherwise it serves one engine: `--gpu N` on the CUDA backend, or the
    CPU backend when built without CUDA, with --backend cpu, or when no GPU is present.
*/
#include "anv_config.h"
#include "anv_error.h"
#include "anv_log.h"
#include "anv_supervisor.h"
#include "gen_worker.h"

#include <czmq.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static gen_worker_t *s_worker;

static void s_on_signal(int sig)
{
    (void)sig;
    gen_worker_drain(s_worker);
}

int main(int argc, char **argv)
{
    char *broker = NULL, *model = NULL, *backend = NULL, *worker_id = NULL, *gpus = NULL;
    char *ready_file = NULL, *log_level = NULL, *curve_secret = NULL, *curve_server = NULL;
    char *kv_dtype = NULL;
    int64_t gpu, slots, threads, kv_mb, max_batch, max_seqs, max_tokens, version, grace_ms;
    bool log_json = false, cuda_graphs = true;
    const anv_cfg_opt_t opts[] = {
        {"broker", ANV_CFG_STR, "tcp://127.0.0.1:5556", 0, -1, "broker worker endpoint", &broker,
         false},
        {"model", ANV_CFG_STR, NULL, 0, -1, "Hugging Face checkpoint directory", &model, false},
        {"backend", ANV_CFG_STR, "auto", 0, -1, "auto, cpu or cuda", &backend, false},
        {"gpu", ANV_CFG_INT, "-1", -1, 1023, "GPU index (-1 = CPU)", &gpu, false},
        {"gpus", ANV_CFG_STR, NULL, 0, -1, "all or a list: one supervised worker per GPU", &gpus,
         false},
        {"worker-id", ANV_CFG_STR, NULL, 0, -1, "stable worker id (default host-gen-pid)",
         &worker_id, false},
        {"slots", ANV_CFG_INT, "0", 0, 65536,
         "units (prompts) held at once (0 = the engine's max-seqs on cuda, 16 on cpu)", &slots,
         false},
        {"threads", ANV_CFG_INT, "0", 0, 1024, "CPU backend threads (0 = one per core)", &threads,
         false},
        {"kv-mb", ANV_CFG_INT, "0", 0, 1 << 24,
         "KV cache MiB (0 = free GPU memory less room for a reload; 256 on CPU)", &kv_mb, false},
        {"kv-dtype", ANV_CFG_STR, "", 0, -1, "KV cache dtype: bf16, f32, fp8 (default: backend's)",
         &kv_dtype, false},
        {"max-batch-tokens", ANV_CFG_INT, "0", 0, 1 << 20, "tokens per step (0 = default)",
         &max_batch, false},
        {"max-seqs", ANV_CFG_INT, "0", 0, 1 << 20,
         "sequences decoded at once at most (0 = 512 on cuda, 256 on cpu)", &max_seqs, false},
        {"max-tokens", ANV_CFG_INT, "1024", 1, 1 << 20, "new tokens when a job sets none",
         &max_tokens, false},
        {"weight-version", ANV_CFG_INT, "0", 0, INT64_MAX, "version of the weights in --model",
         &version, false},
        {"grace-ms", ANV_CFG_INT, "30000", 0, 3600000, "drain grace period on SIGTERM", &grace_ms,
         false},
        {"cuda-graphs", ANV_CFG_BOOL, "true", 0, 0,
         "CUDA backend: decode steps as CUDA graphs (--no-cuda-graphs runs them eagerly)",
         &cuda_graphs, false},
        {"ready-file", ANV_CFG_STR, NULL, 0, -1, "file written once registered (readiness)",
         &ready_file, false},
        {"curve-secret", ANV_CFG_STR, NULL, 0, -1, "own zcert secret key file (CURVE)",
         &curve_secret, false},
        {"curve-server", ANV_CFG_STR, NULL, 0, -1, "the broker's public key file (CURVE)",
         &curve_server, false},
        {"log-level", ANV_CFG_STR, "info", 0, -1, "error, warn, info, debug or trace", &log_level,
         false},
        {"log-json", ANV_CFG_BOOL, "false", 0, -1, "log JSON objects", &log_json, false},
    };
    const size_t n_opts = sizeof opts / sizeof *opts;
    anv_log_init("gen-worker");
    char err[512];
    anv_cfg_rest_t rest;
    if (anv_config_load(opts, n_opts, argc, argv, &rest, err, sizeof err) != 0) {
        fprintf(stderr, "anvil-gen-worker: %s\n", err);
        anv_config_free(opts, n_opts, &rest);
        return 2;
    }
    if (rest.help) {
        printf("usage: anvil-gen-worker --model DIR [options]\n\n");
        anv_config_usage(opts, n_opts, stdout);
        anv_config_free(opts, n_opts, &rest);
        return 0;
    }
    int rc = 2;
    int lvl = anv_log_level_parse(log_level);
    if (lvl < 0 || rest.argc > 0 || !model || !*model) {
        fprintf(stderr, "anvil-gen-worker: %s\n",
                lvl < 0 ? "unknown --log-level" : rest.argc ? "unexpected argument"
                                                            : "--model DIR is required");
        goto out;
    }
    anv_log_set_level((anv_log_level_t)lvl);
    anv_log_set_json(log_json);
    anv_config_log(opts, n_opts);

    if (gpus && *gpus) {
        int list[64];
        int n = anv_gpu_list_parse(gpus, list, 64);
        if (n < 0) {
            fprintf(stderr, "anvil-gen-worker: malformed --gpus '%s'\n", gpus);
            goto out;
        }
        if (n > 0) {
            /* the children get our arguments without --gpus (and with --gpu 0 added) */
            char **args = calloc((size_t)argc + 1, sizeof *args);
            int k = 0;
            for (int i = 0; i < argc; i++) {
                if (!strcmp(argv[i], "--gpus")) {
                    i++;
                    continue;
                }
                if (!strncmp(argv[i], "--gpus=", 7))
                    continue;
                args[k++] = argv[i];
            }
            rc = anv_supervisor_run(args, list, n, (int)grace_ms + 5000);
            free(args);
            goto out;
        }
        ANV_INFO("--gpus %s: no GPU found, serving one CPU worker", gpus);
    }

    const char *be = backend;
    if (!strcmp(be, "auto")) {
#ifdef ANVIL_HAVE_CUDA
        be = gpu >= 0 || anv_gpu_count() > 0 ? "cuda" : "cpu";
#else
        be = "cpu";
#endif
    }
    if (!strcmp(be, "cuda") && gpu < 0)
        gpu = 0;
    gen_worker_config_t cfg = {
        .broker = broker,
        .worker_id = worker_id,
        .model_dir = model,
        .backend = be,
        .gpu_index = !strcmp(be, "cuda") ? (int)gpu : -1,
        .n_threads = (int)threads,
        .slots = (int)slots,
        .kv_mb = kv_mb,
        .kv_dtype = kv_dtype,
        .max_batch_tokens = (int)max_batch,
        .max_seqs = (int)max_seqs,
        .default_max_tokens = (int)max_tokens,
        .weight_version = (uint64_t)version,
        .grace_ms = grace_ms,
        .ready_file = ready_file,
        .cuda_graphs = cuda_graphs && !strcmp(be, "cuda"),
        .curve_secret = curve_secret,
        .curve_server = curve_server,
    };
    s_worker = gen_worker_new(&cfg);
    if (!s_worker) {
        rc = 1;
        goto out;
    }
    zsys_handler_set(NULL); /* the drain is ours, not CZMQ's interrupt flag */
    struct sigaction sa = {0};
    sa.sa_handler = s_on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    rc = gen_worker_run(s_worker) == 0 ? 0 : 1;
    gen_worker_destroy(&s_worker);
    ANV_INFO("gen worker stopped");
out:
    anv_config_free(opts, n_opts, &rest);
    return rc;
}
