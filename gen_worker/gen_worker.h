/*  gen_worker.h - the generation engine as a broker worker.

    A gen worker owns one engine (one GPU, or the CPU backend) and one broker client. Each
    GenUnit (one prompt, the sample indices of its group) becomes one engine request whose
    request id is the unit's lease id, so the engine prefills the prompt once and forks the
    samples; each finished sample goes back as a GenResult as soon as it is done (`last` on the
    unit's final one). The loop never blocks on the engine: between steps it takes messages
    from the broker (units, cancels, weight updates), so cancels act within one step and the
    client library's own thread keeps heartbeats flowing during long steps.

    Weight updates (WeightsUpdate: version, checkpoint dir, policy):
      FINISH  stop starting new units (they wait in a local backlog, their leases renewed),
              finish what is in flight on the old weights, then load;
      PAUSE   load at once: in-flight sequences are recomputed under the new weights;
      ABORT   finish in-flight samples now as FINISH_ABORTED with the tokens they have (a
              client may resume them), then load.
    Then WeightsLoaded(version, seconds) is sent and every later sample carries the version.

    Draining (gen_worker_drain, on SIGTERM): new units are handed back at once (UnitFailed,
    retryable), in-flight work may finish until the grace period ends, whatever is left is
    handed back, then DISCONNECT. A SIGKILL loses nothing either: the broker re-dispatches the
    leases once they expire.

    One thread runs gen_worker_run(); gen_worker_drain() may be called from a signal handler
    (it only sets a flag).
*/
#ifndef GEN_WORKER_H
#define GEN_WORKER_H

#include <stdbool.h>
#include <stdint.h>

typedef struct gen_worker_t gen_worker_t;

#define GEN_WORKER_HOST_SLOTS 16

typedef struct {
    const char *broker;          /* worker endpoint, e.g. tcp://127.0.0.1:5556 */
    const char *worker_id;       /* NULL = <hostname>-gen-<pid> */
    const char *model_dir;
    const char *backend;         /* "cpu" or "cuda" */
    int gpu_index;               /* -1 = CPU */
    int n_threads;               /* CPU backend threads, 0 = one per core */
    int slots;                   /* units held at once; 0 = the engine's max_seqs on a device
                                    backend (the broker's KV credit bounds it further),
                                    GEN_WORKER_HOST_SLOTS on the CPU */
    int64_t kv_mb;               /* KV budget in MiB, 0 = engine default */
    const char *kv_dtype;        /* KV cache dtype, NULL/"" = the backend's (eng_engine.h) */
    int max_batch_tokens;        /* 0 = engine default */
    int max_seqs;                /* running sequences at most, 0 = engine default */
    int default_max_tokens;      /* when a unit sets none */
    uint64_t weight_version;     /* version of the weights in model_dir */
    int64_t grace_ms;            /* drain grace period */
    const char *ready_file;      /* written once the broker has answered, removed at exit */
    bool cuda_graphs;            /* CUDA backend: decode steps as CUDA graphs */
    const char *curve_secret;    /* own zcert secret file; NULL/"" = no CURVE */
    const char *curve_server;    /* the broker's public key file */
} gen_worker_config_t;

/* Loads the engine and connects. NULL (logged) when the model cannot be loaded. */
gen_worker_t *gen_worker_new(const gen_worker_config_t *cfg);
void gen_worker_destroy(gen_worker_t **self_p);
/* Serves until drained. Returns 0, or a negative code after an engine failure (every lease it
   held has been handed back). */
int gen_worker_run(gen_worker_t *self);
/* Asks the loop to drain and return. Async-signal-safe. */
void gen_worker_drain(gen_worker_t *self);

#endif
