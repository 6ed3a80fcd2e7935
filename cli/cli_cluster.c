/*  cli_cluster.c - `anvil up` / `anvil down`: a local cluster in one data directory.

    `up` starts, as daemons with their logs in DIR/logs: a private redis-server (AOF on, data
    in DIR/redis), the broker, one gen worker and one exec worker per GPU (none: one CPU gen
    worker on a small model and one CPU exec worker in Triton's interpreter). Everything that
    can be checked before starting anything is (binaries, model, GPUs); after each start the
    state file DIR/run/cluster.json is rewritten (pids, binaries, logs, endpoints), so that a
    failure half way, or a later `down`, stops exactly what was started. `up` returns only when
    every worker has registered with the broker (WORKERS, matched by pid when the broker
    reports it) or stops everything it started and says which process failed, with its log.
    `down` sends SIGTERM in reverse order (workers, broker, Redis, which rewrites nothing and
    loses nothing: the AOF is fsynced on shutdown), waits, and SIGKILLs only after the grace
    period. DIR/run/lock (flock) keeps two `up`/`down` from racing on one directory.
    Servers are configured through ANVIL_<NAME> environment variables (anv_config), which a
    binary ignores when it has no such option, rather than flags it might reject.
    `up --curve` makes the broker/client/worker key set in DIR/keys once (cli_keys.h), runs
    every socket with CURVE and records the client keys in cluster.json for `anvil` commands.
*/
#include "anv_error.h"
#include "anv_msg.h"
#include "anv_time.h"
#include "cli_client.h"
#include "cli_cmd.h"
#include "cli_json.h"
#include "cli_keys.h"
#include "cli_proc.h"
#include "cli_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define CLI_CLUSTER_MAX_GPUS 16
#define S_MAX_PROCS (2 + 2 * CLI_CLUSTER_MAX_GPUS)

typedef struct {
    char role[16]; /* redis, broker, gen-worker, exec-worker */
    int pid;
    int gpu; /* -1 = CPU */
    char bin[PATH_MAX];
    char log[PATH_MAX];
} s_proc_t;

typedef struct {
    char data[1024]; /* longer data directories are refused */
    char client_ep[256], worker_ep[256], redis_url[128];
    char model[PATH_MAX];
    s_proc_t procs[S_MAX_PROCS];
    size_t n;
    int64_t started_ms;
    char curve_secret[PATH_MAX], curve_server[PATH_MAX]; /* client keys; "" = plaintext */
} s_cluster_t;

/* ---------------------------------------------------------------------------------------- */
/* state file */

static void s_path(const s_cluster_t *cl, const char *rel, char *buf, size_t len)
{
    snprintf(buf, len, "%s/%s", cl->data, rel);
}

static cJSON *s_state_json(const s_cluster_t *cl)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "version", 1);
    cJSON_AddStringToObject(o, "data_dir", cl->data);
    cJSON_AddStringToObject(o, "client_endpoint", cl->client_ep);
    cJSON_AddStringToObject(o, "worker_endpoint", cl->worker_ep);
    cJSON_AddStringToObject(o, "redis_url", cl->redis_url);
    cJSON_AddStringToObject(o, "model", cl->model);
    cJSON_AddNumberToObject(o, "started_ms", (double)cl->started_ms);
    if (cl->curve_secret[0]) {
        /* what `anvil` commands use to reach this cluster (cli_util.c) */
        cJSON_AddStringToObject(o, "curve_secret", cl->curve_secret);
        cJSON_AddStringToObject(o, "curve_server", cl->curve_server);
    }
    cJSON *a = cJSON_AddArrayToObject(o, "processes");
    for (size_t i = 0; a && i < cl->n; i++) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "role", cl->procs[i].role);
        cJSON_AddNumberToObject(p, "pid", cl->procs[i].pid);
        cJSON_AddNumberToObject(p, "gpu", cl->procs[i].gpu);
        cJSON_AddStringToObject(p, "bin", cl->procs[i].bin);
        cJSON_AddStringToObject(p, "log", cl->procs[i].log);
        cJSON_AddItemToArray(a, p);
    }
    return o;
}

static int s_state_write(const s_cluster_t *cl)
{
    char path[PATH_MAX + 64], tmp[PATH_MAX + 80];
    s_path(cl, "run/cluster.json", path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    cJSON *doc = s_state_json(cl);
    char *text = doc ? cJSON_Print(doc) : NULL;
    cJSON_Delete(doc);
    FILE *f = text ? fopen(tmp, "w") : NULL;
    int rc = 0;
    if (!f || fputs(text, f) < 0 || fputc('\n', f) < 0 || fflush(f) || fsync(fileno(f)))
        rc = -(errno ? errno : ENOMEM);
    if (f && fclose(f) && !rc)
        rc = -errno;
    if (!rc && rename(tmp, path) != 0)
        rc = -errno;
    free(text);
    if (rc)
        cli_errorf("up", "cannot write '%s': %s", path, strerror(-rc));
    return rc;
}

static void s_copy(char *dst, size_t len, const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    snprintf(dst, len, "%s", cJSON_IsString(v) ? v->valuestring : "");
}

/* Returns 0, ANV_ENOTFOUND when there is no state file, ANV_EFORMAT when it is unreadable. */
static int s_state_read(const char *data, s_cluster_t *cl)
{
    memset(cl, 0, sizeof *cl);
    snprintf(cl->data, sizeof cl->data, "%s", data);
    char path[PATH_MAX + 64];
    s_path(cl, "run/cluster.json", path, sizeof path);
    FILE *f = fopen(path, "r");
    if (!f)
        return errno == ENOENT ? ANV_ENOTFOUND : -errno;
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *o = cJSON_Parse(buf);
    const cJSON *procs = cJSON_GetObjectItemCaseSensitive(o, "processes");
    if (!cJSON_IsArray(procs)) {
        cJSON_Delete(o);
        return ANV_EFORMAT;
    }
    s_copy(cl->client_ep, sizeof cl->client_ep, o, "client_endpoint");
    s_copy(cl->worker_ep, sizeof cl->worker_ep, o, "worker_endpoint");
    s_copy(cl->redis_url, sizeof cl->redis_url, o, "redis_url");
    s_copy(cl->model, sizeof cl->model, o, "model");
    s_copy(cl->curve_secret, sizeof cl->curve_secret, o, "curve_secret");
    s_copy(cl->curve_server, sizeof cl->curve_server, o, "curve_server");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "started_ms");
    cl->started_ms = cJSON_IsNumber(st) ? (int64_t)st->valuedouble : 0;
    for (const cJSON *p = procs->child; p && cl->n < S_MAX_PROCS; p = p->next) {
        s_proc_t *x = &cl->procs[cl->n];
        const cJSON *pid = cJSON_GetObjectItemCaseSensitive(p, "pid");
        const cJSON *gpu = cJSON_GetObjectItemCaseSensitive(p, "gpu");
        if (!cJSON_IsNumber(pid) || pid->valuedouble <= 0)
            continue;
        x->pid = (int)pid->valuedouble;
        x->gpu = cJSON_IsNumber(gpu) ? (int)gpu->valuedouble : -1;
        s_copy(x->role, sizeof x->role, p, "role");
        s_copy(x->bin, sizeof x->bin, p, "bin");
        s_copy(x->log, sizeof x->log, p, "log");
        cl->n++;
    }
    cJSON_Delete(o);
    return 0;
}

static int s_lock(const char *data, const char *cmd)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/run/lock", data);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        cli_errorf(cmd, "cannot open '%s': %s", path, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        cli_errorf(cmd, "another `anvil up` or `anvil down` is running on '%s'", data);
        close(fd);
        return -1;
    }
    return fd;
}

/* ---------------------------------------------------------------------------------------- */
/* stopping */

/* Stops the processes of cl in reverse start order. Returns how many had to be killed. */
static int s_stop_all(const s_cluster_t *cl, double grace, bool verbose)
{
    int killed_n = 0;
    for (size_t i = cl->n; i-- > 0;) {
        const s_proc_t *p = &cl->procs[i];
        bool was = cli_proc_alive(p->pid, p->bin), killed = false;
        int rc = cli_proc_stop(p->pid, p->bin, grace, &killed);
        if (killed) {
            killed_n++;
            fprintf(stderr, "anvil down: %s (pid %d) did not stop within %.0f s: killed\n",
                    p->role, p->pid, grace);
        }
        if (rc)
            fprintf(stderr, "anvil down: cannot stop %s (pid %d): %s\n", p->role, p->pid,
                    strerror(-rc));
        else if (verbose && was && !killed)
            fprintf(stderr, "anvil down: stopped %s (pid %d)\n", p->role, p->pid);
        else if (verbose && !was)
            fprintf(stderr, "anvil down: %s (pid %d) was not running\n", p->role, p->pid);
    }
    return killed_n;
}

int cli_cmd_down(int argc, char **argv)
{
    static const cli_cmd_info_t info = {
        "down", "[--data DIR] [options]",
        "Stops the local cluster started by `anvil up` in DIR: workers first, then the broker, "
        "then Redis (SIGTERM, SIGKILL only after --grace seconds). Jobs and results stay in "
        "DIR; `anvil up` brings them back."};
    cli_common_t c = {0};
    double grace = 30;
    anv_cfg_opt_t opts[CLI_MAX_OPTS] = {
        {"grace", ANV_CFG_DOUBLE, "30", 0, 3600, "seconds to wait for each process to stop",
         &grace, false}};
    size_t n = 1;
    cli_common_opts(&c, opts, &n);
    anv_cfg_rest_t rest;
    int code, lock = -1;
    cli_load(&info, opts, n, argc, argv, &rest, &c, &code);
    if (code >= 0)
        goto out;
    s_cluster_t cl;
    int rc = s_state_read(c.data, &cl);
    if (rc == ANV_ENOTFOUND) {
        fprintf(stderr, "anvil down: no local cluster in '%s'\n", c.data);
        code = CLI_EXIT_OK;
        goto out;
    }
    if (rc) {
        cli_errorf(info.name, "cannot read '%s/run/cluster.json' (%s): stop the processes by "
                              "hand", c.data, anv_strerror(rc));
        code = CLI_EXIT_CLUSTER;
        goto out;
    }
    if ((lock = s_lock(c.data, info.name)) < 0) {
        code = CLI_EXIT_CLUSTER;
        goto out;
    }
    int killed = s_stop_all(&cl, grace, !c.json);
    char path[PATH_MAX + 64];
    s_path(&cl, "run/cluster.json", path, sizeof path);
    unlink(path);
    if (c.json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "data_dir", c.data);
        cJSON_AddNumberToObject(o, "stopped", (double)cl.n);
        cJSON_AddNumberToObject(o, "killed", killed);
        cli_json_print(o, stdout);
    } else {
        printf("local cluster in %s stopped; its jobs and results stay there (anvil up brings "
               "them back)\n", c.data);
    }
    code = CLI_EXIT_OK;
out:
    if (lock >= 0)
        close(lock);
    anv_config_free(opts, n, &rest);
    return code;
}

/* ---------------------------------------------------------------------------------------- */
/* starting */

typedef struct {
    char *gpus, *model, *client_ep, *worker_ep, *broker_bin, *gen_bin, *exec_bin, *redis_bin;
    char *make_model;
    int64_t redis_port;
    double wait, grace;
    bool workers, curve, insecure;
} s_up_opts_t;

static bool s_redis_ping(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {.tv_sec = 1};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[16] = {0};
    bool ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
              write(fd, "PING\r\n", 6) == 6 && read(fd, buf, sizeof buf - 1) > 0 &&
              !strncmp(buf, "+PONG", 5);
    close(fd);
    return ok;
}

static int s_add_proc(s_cluster_t *cl, const char *role, int gpu, const char *bin,
                      char *const argv[], const char *const env[])
{
    s_proc_t *p = &cl->procs[cl->n];
    memset(p, 0, sizeof *p);
    snprintf(p->role, sizeof p->role, "%s", role);
    snprintf(p->bin, sizeof p->bin, "%s", bin);
    p->gpu = gpu;
    char log[sizeof p->log];
    if (gpu >= 0)
        snprintf(log, sizeof log, "%s/logs/%s-gpu%d.log", cl->data, role, gpu);
    else if (!strcmp(role, "gen-worker") || !strcmp(role, "exec-worker"))
        snprintf(log, sizeof log, "%s/logs/%s-cpu.log", cl->data, role);
    else
        snprintf(log, sizeof log, "%s/logs/%s.log", cl->data, role);
    memcpy(p->log, log, sizeof log);
    char err[512];
    pid_t pid = cli_proc_spawn_daemon(bin, argv, env, p->log, err, sizeof err);
    if (pid < 0) {
        cli_errorf("up", "%s", err);
        return -1;
    }
    p->pid = (int)pid;
    cl->n++;
    return s_state_write(cl);
}

/* A started process that died: say so with its log. */
static bool s_check_dead(const s_cluster_t *cl)
{
    for (size_t i = 0; i < cl->n; i++) {
        const s_proc_t *p = &cl->procs[i];
        int st;
        if (cli_proc_exited(p->pid, &st)) {
            cli_errorf("up", "%s (pid %d) exited during start-up (status %d)", p->role, p->pid,
                       WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
            cli_proc_log_tail(p->log, 15);
            return true;
        }
    }
    return false;
}

static int s_start_redis(s_cluster_t *cl, const s_up_opts_t *o, const char *bin)
{
    char dir[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/redis", cl->data);
    for (int attempt = 0; attempt < 5; attempt++) {
        int port = o->redis_port ? (int)o->redis_port : cli_proc_free_port();
        char ports[16];
        snprintf(ports, sizeof ports, "%d", port);
        /* argv[0] must say redis-server: the resolved binary is also redis-check-rdb */
        char *argv[] = {"redis-server", "--port", ports, "--bind", "127.0.0.1", "--dir", dir,
                        "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
                        "--daemonize", "no", "--protected-mode", "yes", NULL};
        if (s_add_proc(cl, "redis", -1, bin, argv, NULL))
            return -1;
        for (int i = 0; i < 200; i++) {
            if (s_redis_ping(port)) {
                snprintf(cl->redis_url, sizeof cl->redis_url, "redis://127.0.0.1:%d", port);
                return s_state_write(cl);
            }
            int st;
            if (cli_proc_exited(cl->procs[cl->n - 1].pid, &st))
                break;
            anv_sleep_ms(25);
        }
        /* it died or never answered: a port taken in between, most likely */
        bool killed;
        cli_proc_stop(cl->procs[cl->n - 1].pid, bin, 2, &killed);
        cl->n--;
        if (o->redis_port)
            break;
    }
    cli_errorf("up", "redis-server did not start (see %s/logs/redis.log)", cl->data);
    cli_proc_log_tail(cl->procs[cl->n].log, 10);
    return -1;
}

/* Waits until the broker answers WORKERS; fills *reply when asked. */
static int s_workers(const s_cluster_t *cl, int timeout_ms, Anvil__Envelope **reply)
{
    char err[512];
    cli_client_t *c = cli_client_new(cl->client_ep, cl->curve_secret, cl->curve_server, err,
                                     sizeof err);
    if (!c) {
        cli_errorf("up", "%s", err);
        return ANV_ECONFIG;
    }
    Anvil__Envelope req;
    Anvil__WorkersRequest wr;
    anv_msg_init(&req);
    anvil__workers_request__init(&wr);
    req.body_case = ANVIL__ENVELOPE__BODY_WORKERS;
    req.workers = &wr;
    int rc = cli_client_call(c, &req, ANVIL__ENVELOPE__BODY_WORKERS_REPLY, timeout_ms, reply);
    cli_client_destroy(&c);
    return rc;
}

/* Is the worker we started as p registered (and alive) in the reply? */
static bool s_registered(const Anvil__WorkersReply *r, const s_proc_t *p, int *unmatched_gen,
                         int *unmatched_exec)
{
    Anvil__WorkerKind kind = !strcmp(p->role, "gen-worker") ? ANVIL__WORKER_KIND__WORKER_GEN
                                                             : ANVIL__WORKER_KIND__WORKER_EXEC;
    for (size_t i = 0; i < r->n_workers; i++) {
        const Anvil__WorkerInfo *w = r->workers[i];
        if (w->kind != kind || (w->state && !strcmp(w->state, "dead")))
            continue;
        if (w->has_pid && w->pid == (uint32_t)p->pid)
            return true;
    }
    /* a broker that does not report pids: count live workers of the kind instead */
    int *pool = kind == ANVIL__WORKER_KIND__WORKER_GEN ? unmatched_gen : unmatched_exec;
    if (*pool > 0) {
        (*pool)--;
        return true;
    }
    return false;
}

static int s_wait_registered(const s_cluster_t *cl, double wait_s)
{
    double deadline = anv_now_s() + wait_s;
    int expected = 0;
    for (size_t i = 0; i < cl->n; i++)
        expected += !strcmp(cl->procs[i].role, "gen-worker") ||
                    !strcmp(cl->procs[i].role, "exec-worker");
    for (;;) {
        if (cli_interrupted)
            return ANV_ECANCELLED;
        if (s_check_dead(cl))
            return ANV_ESTATE;
        Anvil__Envelope *rep = NULL;
        int rc = s_workers(cl, 1000, &rep);
        if (rc == 0) {
            const Anvil__WorkersReply *r = rep->workers_reply;
            int gen = 0, exec = 0, ok = 0;
            for (size_t i = 0; i < r->n_workers; i++) {
                const Anvil__WorkerInfo *w = r->workers[i];
                if (w->has_pid || (w->state && !strcmp(w->state, "dead")))
                    continue;
                gen += w->kind == ANVIL__WORKER_KIND__WORKER_GEN;
                exec += w->kind == ANVIL__WORKER_KIND__WORKER_EXEC;
            }
            const s_proc_t *missing = NULL;
            for (size_t i = 0; i < cl->n; i++) {
                const s_proc_t *p = &cl->procs[i];
                if (strcmp(p->role, "gen-worker") && strcmp(p->role, "exec-worker"))
                    continue;
                if (s_registered(r, p, &gen, &exec))
                    ok++;
                else if (!missing)
                    missing = p;
            }
            anv_msg_free(&rep);
            if (ok == expected)
                return 0;
            if (anv_now_s() >= deadline) {
                cli_errorf("up", "%s (pid %d) did not register with the broker within %.0f s",
                           missing ? missing->role : "a worker", missing ? missing->pid : 0,
                           wait_s);
                if (missing)
                    cli_proc_log_tail(missing->log, 15);
                return ANV_ETIMEOUT;
            }
        } else if (anv_now_s() >= deadline) {
            cli_errorf("up", "the broker does not answer on %s after %.0f s", cl->client_ep,
                       wait_s);
            cli_proc_log_tail(cl->procs[1].log, 15);
            return ANV_ETIMEOUT;
        }
        anv_sleep_ms(250);
    }
}

/* GPUs to use: "none", "all"/"" (whatever nvidia-smi lists), or "0,2". Returns the count. */
static int s_gpus(const char *spec, int *out, char *err, size_t errlen)
{
    if (!strcmp(spec, "none") || !strcmp(spec, "cpu"))
        return 0;
    if (!*spec || !strcmp(spec, "all")) {
        char *smi = cli_proc_find("", "nvidia-smi"), *text = NULL;
        int n = 0;
        if (smi) {
            char *argv[] = {smi, "-L", NULL};
            if (cli_proc_run(argv, &text) == 0 && text)
                for (char *p = text; (p = strstr(p, "GPU ")) && n < CLI_CLUSTER_MAX_GPUS; p++)
                    if (p == text || p[-1] == '\n')
                        out[n] = n, n++;
            free(text);
            free(smi);
        }
        if (!n && !strcmp(spec, "all")) {
            snprintf(err, errlen, "--gpus all: no GPU found (nvidia-smi -L lists none)");
            return -1;
        }
        return n;
    }
    int n = 0;
    for (const char *p = spec; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 1023 || (*end && *end != ',') ||
            n == CLI_CLUSTER_MAX_GPUS) {
            snprintf(err, errlen, "--gpus '%s': expected none, all, or a list like 0,1", spec);
            return -1;
        }
        out[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return n;
}

/* The model for gen workers: --model, else (CPU only) a small random one made by the engine's
   tool. */
static int s_model(const s_up_opts_t *o, int n_gpus, s_cluster_t *cl)
{
    if (o->model && *o->model) {
        char cfg[PATH_MAX + 32];
        snprintf(cfg, sizeof cfg, "%s/config.json", o->model);
        if (access(cfg, R_OK) != 0) {
            cli_errorf("up", "--model '%s' is not a checkpoint directory (no config.json)",
                       o->model);
            return -1;
        }
        if (!realpath(o->model, cl->model))
            snprintf(cl->model, sizeof cl->model, "%s", o->model);
        return 0;
    }
    if (n_gpus > 0) {
        cli_errorf("up", "GPU workers need a model: pass --model DIR (a Hugging Face checkpoint "
                         "directory, e.g. AutoTriton 8B), or --gpus none for a CPU cluster");
        return -1;
    }
    snprintf(cl->model, sizeof cl->model, "%s/models/random-tiny", cl->data);
    char cfg[PATH_MAX + 32];
    snprintf(cfg, sizeof cfg, "%s/config.json", cl->model);
    if (access(cfg, R_OK) == 0)
        return 0;
    char *tool = o->make_model && *o->make_model ? strdup(o->make_model)
                                                  : cli_proc_find("gen_worker", "anvil-make-model");
    if (!tool || access(tool, X_OK) != 0) {
        cli_errorf("up", "no model to run: pass --model DIR (a Hugging Face checkpoint "
                         "directory), or build the engine's random-model tool "
                         "(anvil-make-model: not found next to %s nor on PATH; --make-model "
                         "names it). Nothing was started.",
                   cli_proc_self());
        free(tool);
        return -1;
    }
    char models[PATH_MAX + 16];
    snprintf(models, sizeof models, "%s/models", cl->data);
    cli_mkdir_p(models);
    fprintf(stderr, "anvil up: no --model: making a small random model in %s\n", cl->model);
    char *argv[] = {tool, "--random", "--out", cl->model, NULL};
    int rc = cli_proc_run(argv, NULL);
    free(tool);
    if (rc != 0 || access(cfg, R_OK) != 0) {
        cli_errorf("up", "the random-model tool failed (exit %d): no model in %s", rc,
                   cl->model);
        return -1;
    }
    return 0;
}

static char *s_bin(const char *given, const char *subdir, const char *name)
{
    if (given && *given) {
        char buf[PATH_MAX];
        return access(given, X_OK) == 0 && realpath(given, buf) ? strdup(buf) : NULL;
    }
#ifdef ANVIL_REDIS_SERVER
    if (!strcmp(name, "redis-server") && access(ANVIL_REDIS_SERVER, X_OK) == 0) {
        char buf[PATH_MAX];
        if (realpath(ANVIL_REDIS_SERVER, buf))
            return strdup(buf);
    }
#endif
    return cli_proc_find(subdir, name);
}

static void s_print_up(const s_cluster_t *cl, bool json, bool already)
{
    if (json) {
        cJSON *o = s_state_json(cl);
        cJSON_AddBoolToObject(o, "already_running", already);
        cli_json_print(o, stdout);
        return;
    }
    printf("local cluster %s in %s\n", already ? "already running" : "up", cl->data);
    for (size_t i = 0; i < cl->n; i++) {
        const s_proc_t *p = &cl->procs[i];
        char where[PATH_MAX + 1200] = "";
        if (!strcmp(p->role, "redis"))
            snprintf(where, sizeof where, "%s (AOF in %s/redis)", cl->redis_url, cl->data);
        else if (!strcmp(p->role, "broker"))
            snprintf(where, sizeof where, "clients %s, workers %s", cl->client_ep, cl->worker_ep);
        else if (!strcmp(p->role, "gen-worker"))
            snprintf(where, sizeof where, "%s%d, model %s", p->gpu >= 0 ? "gpu " : "cpu",
                     p->gpu, cl->model);
        else
            snprintf(where, sizeof where, "%s", p->gpu >= 0 ? "gpu" : "cpu, Triton interpreter");
        if (!strcmp(p->role, "gen-worker") && p->gpu < 0)
            snprintf(where, sizeof where, "cpu, model %s", cl->model);
        if (!strcmp(p->role, "exec-worker") && p->gpu >= 0)
            snprintf(where, sizeof where, "gpu %d", p->gpu);
        printf("  %-12s pid %-7d %s\n               log %s\n", p->role, p->pid, where, p->log);
    }
    if (cl->curve_secret[0])
        printf("curve: on, keys in %s/keys (remote workers: worker.key_secret and broker.key)\n",
               cl->data);
    printf("use it: anvil submit FILE.jsonl --wait   (ANVIL_BROKER=%s)\nstop it: anvil down%s%s\n",
           cl->client_ep, " --data ", cl->data);
}

int cli_cmd_up(int argc, char **argv)
{
    static const cli_cmd_info_t info = {
        "up", "[--data DIR] [--gpus LIST|none] [--model DIR] [options]",
        "Starts a local cluster as background processes: a private redis-server (AOF on, "
        "data in DIR/redis), the broker, one gen worker and one exec worker per GPU; with no "
        "GPU, one CPU gen worker (on --model, or a small random model) and one CPU exec worker "
        "running kernels in Triton's interpreter. Waits until every worker has registered, "
        "then prints where everything is. Binaries are looked for next to this one's build "
        "tree (<build>/broker/anvil-broker, ...), then on PATH. `anvil down` stops it."};
    cli_common_t c = {0};
    s_up_opts_t o = {0};
    anv_cfg_opt_t opts[CLI_MAX_OPTS] = {
        {"gpus", ANV_CFG_STR, NULL, 0, -1, "GPUs to use: none, all, or a list like 0,1 "
                                           "(default: all that nvidia-smi lists)", &o.gpus, false},
        {"model", ANV_CFG_STR, NULL, 0, -1, "Hugging Face checkpoint directory for gen workers",
         &o.model, false},
        {"client-endpoint", ANV_CFG_STR, CLI_DEFAULT_BROKER, 0, -1, "broker endpoint for clients",
         &o.client_ep, false},
        {"worker-endpoint", ANV_CFG_STR, "tcp://127.0.0.1:5556", 0, -1,
         "broker endpoint for workers", &o.worker_ep, false},
        {"redis-port", ANV_CFG_INT, "0", 0, 65535, "Redis port (0 = any free one)",
         &o.redis_port, false},
        {"broker-bin", ANV_CFG_STR, NULL, 0, -1, "path of anvil-broker", &o.broker_bin, false},
        {"gen-worker-bin", ANV_CFG_STR, NULL, 0, -1, "path of anvil-gen-worker", &o.gen_bin,
         false},
        {"exec-worker-bin", ANV_CFG_STR, NULL, 0, -1, "path of anvil-exec-worker", &o.exec_bin,
         false},
        {"redis-server", ANV_CFG_STR, NULL, 0, -1, "path of redis-server", &o.redis_bin, false},
        {"make-model", ANV_CFG_STR, NULL, 0, -1, "path of the random-model tool "
                                                 "(anvil-make-model)", &o.make_model, false},
        {"wait", ANV_CFG_DOUBLE, "300", 1, 86400, "seconds to wait for the workers to register",
         &o.wait, false},
        {"grace", ANV_CFG_DOUBLE, "30", 0, 3600, "seconds to let a process stop on failure",
         &o.grace, false},
        {"workers", ANV_CFG_BOOL, "true", 0, -1,
         "start workers (--no-workers: Redis and the broker only, workers join from elsewhere)",
         &o.workers, false},
        {"curve", ANV_CFG_BOOL, "false", 0, -1,
         "CURVE on every socket: keys made once in DIR/keys (anvil keys gen), used by the "
         "broker, the workers and `anvil` commands",
         &o.curve, false},
        {"insecure", ANV_CFG_BOOL, "false", 0, -1,
         "let the broker serve plaintext on non-loopback endpoints (without --curve)",
         &o.insecure, false},
    };
    size_t n = 15;
    cli_common_opts(&c, opts, &n);
    anv_cfg_rest_t rest;
    int code, lock = -1;
    char *bins[4] = {NULL};
    s_cluster_t cl;
    memset(&cl, 0, sizeof cl);
    cli_load(&info, opts, n, argc, argv, &rest, &c, &code);
    if (code >= 0)
        goto out;
    code = CLI_EXIT_CLUSTER;
    if (rest.argc) {
        cli_errorf(info.name, "takes no arguments (see anvil up --help)");
        code = CLI_EXIT_USAGE;
        goto out;
    }
    char sub[PATH_MAX + 16];
    static const char *const subs[] = {"redis", "run", "logs"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(sub, sizeof sub, "%s/%s", c.data, subs[i]);
        int rc = cli_mkdir_p(sub);
        if (rc) {
            cli_errorf(info.name, "cannot create '%s': %s", sub, strerror(-rc));
            goto out;
        }
    }
    if ((lock = s_lock(c.data, info.name)) < 0)
        goto out;
    /* already up? */
    s_cluster_t old;
    if (s_state_read(c.data, &old) == 0) {
        size_t alive = 0;
        for (size_t i = 0; i < old.n; i++)
            alive += cli_proc_alive(old.procs[i].pid, old.procs[i].bin);
        if (alive == old.n && old.n) {
            s_print_up(&old, c.json, true);
            code = CLI_EXIT_OK;
            goto out;
        }
        if (alive) {
            cli_errorf(info.name, "the cluster in '%s' is half running (%zu of %zu processes): "
                                  "run `anvil down --data %s` first", c.data, alive, old.n,
                       c.data);
            goto out;
        }
        /* stale state of a cluster that is gone (a reboot): start afresh */
    }
    char real[PATH_MAX];
    if (!realpath(c.data, real) || strlen(real) >= sizeof cl.data - 64) {
        cli_errorf(info.name, "data directory '%s' is unusable or its path too long", c.data);
        goto out;
    }
    snprintf(cl.data, sizeof cl.data, "%s", real);
    snprintf(cl.client_ep, sizeof cl.client_ep, "%s", o.client_ep);
    snprintf(cl.worker_ep, sizeof cl.worker_ep, "%s", o.worker_ep);
    cl.started_ms = anv_wall_ms();
    /* everything that can be checked before starting anything */
    bins[0] = s_bin(o.redis_bin, "", "redis-server");
    bins[1] = s_bin(o.broker_bin, "broker", "anvil-broker");
    if (o.workers) {
        bins[2] = s_bin(o.gen_bin, "gen_worker", "anvil-gen-worker");
        bins[3] = s_bin(o.exec_bin, "exec_worker", "anvil-exec-worker");
    }
    static const char *const names[] = {"redis-server", "anvil-broker", "anvil-gen-worker",
                                        "anvil-exec-worker"};
    static const char *const flags[] = {"--redis-server", "--broker-bin", "--gen-worker-bin",
                                        "--exec-worker-bin"};
    bool missing = false;
    for (int i = 0; i < (o.workers ? 4 : 2); i++)
        if (!bins[i]) {
            cli_errorf(info.name, "%s not found (looked next to %s and on PATH; %s names it)",
                       names[i], cli_proc_self(), flags[i]);
            missing = true;
        }
    if (missing) {
        fprintf(stderr, "anvil up: nothing was started\n");
        goto out;
    }
    int gpus[CLI_CLUSTER_MAX_GPUS];
    char err[256];
    int n_gpus = s_gpus(o.gpus ? o.gpus : "", gpus, err, sizeof err);
    if (n_gpus < 0) {
        cli_errorf(info.name, "%s", err);
        code = CLI_EXIT_USAGE;
        goto out;
    }
    if (o.workers && s_model(&o, n_gpus, &cl))
        goto out;

    /* keys: made once, kept across restarts so that remote workers holding them still fit.
       Without --curve the keys variables are set empty, so that a client key exported in
       this shell does not end up as the broker's. */
    char e_bsecret[PATH_MAX + 32] = "ANVIL_CURVE_SECRET=", e_allow[PATH_MAX + 32] =
                                                               "ANVIL_CURVE_ALLOW=";
    char e_wsecret[PATH_MAX + 32] = "ANVIL_CURVE_SECRET=", e_server[PATH_MAX + 32] =
                                                               "ANVIL_CURVE_SERVER=";
    if (o.curve) {
        char keys[sizeof cl.data + 8];
        snprintf(keys, sizeof keys, "%.1023s/keys", cl.data);
        if (cli_keys_make_set(keys, false, true, err, sizeof err)) {
            cli_errorf(info.name, "%s", err);
            goto out;
        }
        snprintf(e_bsecret, sizeof e_bsecret, "ANVIL_CURVE_SECRET=%s/broker.key_secret", keys);
        snprintf(e_allow, sizeof e_allow, "ANVIL_CURVE_ALLOW=%s/allow", keys);
        snprintf(e_wsecret, sizeof e_wsecret, "ANVIL_CURVE_SECRET=%s/worker.key_secret", keys);
        snprintf(e_server, sizeof e_server, "ANVIL_CURVE_SERVER=%s/broker.key", keys);
        snprintf(cl.curve_secret, sizeof cl.curve_secret, "%s/client.key_secret", keys);
        snprintf(cl.curve_server, sizeof cl.curve_server, "%s/broker.key", keys);
    }

    /* start: redis, broker, workers */
    if (s_start_redis(&cl, &o, bins[0]))
        goto fail;
    char e_redis[200], e_client[300], e_worker[300], e_model[PATH_MAX + 16];
    snprintf(e_redis, sizeof e_redis, "ANVIL_REDIS_URL=%s", cl.redis_url);
    snprintf(e_client, sizeof e_client, "ANVIL_CLIENT_ENDPOINT=%s", cl.client_ep);
    snprintf(e_worker, sizeof e_worker, "ANVIL_WORKER_ENDPOINT=%s", cl.worker_ep);
    const char *benv[] = {e_redis, e_client, e_worker, e_bsecret, e_allow,
                          o.insecure ? "ANVIL_INSECURE=true" : "ANVIL_INSECURE=false", NULL};
    char *bargv[] = {bins[1], NULL};
    if (s_add_proc(&cl, "broker", -1, bins[1], bargv, benv))
        goto fail;
    char e_broker[300];
    snprintf(e_broker, sizeof e_broker, "ANVIL_BROKER=%s", cl.worker_ep);
    snprintf(e_model, sizeof e_model, "ANVIL_MODEL=%s", cl.model);
    char e_python[PATH_MAX + 32] = "";
#ifdef ANVIL_SOURCE_DIR
    if (access(ANVIL_SOURCE_DIR "/.venv/bin/python", X_OK) == 0)
        snprintf(e_python, sizeof e_python, "ANVIL_PYTHON=%s", ANVIL_SOURCE_DIR "/.venv/bin/python");
#endif
    int n_units = n_gpus ? n_gpus : 1;
    for (int k = 0; o.workers && k < 2; k++)
        for (int i = 0; i < n_units; i++) {
            int gpu = n_gpus ? gpus[i] : -1;
            char e_gpu[32];
            snprintf(e_gpu, sizeof e_gpu, "ANVIL_GPU=%d", gpu);
            /* gen workers take --backend, exec workers --device (and the repo's venv python
               when there is one) */
            const char *dev = gpu >= 0 ? "ANVIL_DEVICE=cuda" : "ANVIL_DEVICE=cpu";
            const char *backend = gpu >= 0 ? "ANVIL_BACKEND=cuda" : "ANVIL_BACKEND=cpu";
            const char *genv[] = {e_broker, e_model, e_gpu, backend, e_wsecret, e_server, NULL};
            const char *xenv[] = {e_broker, dev, e_python[0] ? e_python : "ANVIL_NOP=1",
                                  gpu >= 0 ? e_gpu : "TRITON_INTERPRET=1", e_wsecret, e_server,
                                  NULL};
            char *wargv[] = {bins[2 + k], NULL};
            if (s_add_proc(&cl, k == 0 ? "gen-worker" : "exec-worker", gpu, bins[2 + k], wargv,
                           k == 0 ? genv : xenv))
                goto fail;
        }
    int rc = s_wait_registered(&cl, o.wait);
    if (rc) {
        if (rc == ANV_ECANCELLED)
            cli_errorf(info.name, "interrupted");
        goto fail;
    }
    s_print_up(&cl, c.json, false);
    code = CLI_EXIT_OK;
    goto out;
fail:
    fprintf(stderr, "anvil up: stopping what was started\n");
    s_stop_all(&cl, o.grace, false);
    s_path(&cl, "run/cluster.json", sub, sizeof sub);
    unlink(sub);
    code = cli_interrupted ? CLI_EXIT_INTERRUPTED : CLI_EXIT_CLUSTER;
out:
    for (int i = 0; i < 4; i++)
        free(bins[i]);
    if (lock >= 0)
        close(lock);
    anv_config_free(opts, n, &rest);
    return code;
}
