"""server.py - the command loop of one sandboxed harness process.

Start-up imports torch and triton (the expensive part, done while the process waits in the
warm pool), installs the launch counter on Triton's launcher, takes private references to the
clocks, synchronize and Event it times with (so a candidate that rebinds torch.cuda.synchronize
or time.perf_counter changes nothing the harness uses, and is seen by the tamper check), and
says {"event": "ready"} on the reply pipe. CUDA is not touched until a command names device
"cuda". Then one JSON command per line on CMD_FD, one JSON reply per line on REPLY_FD:

  static  {code, kind, test?, allow_ops}     -> {errors, syntax_error}
  load    {kind, task, device, init_seed, globals, code?}  (code given = candidate)
                                             -> {load_ms} | {error, tb, phase: compile}
  trials  {seeds, modes, dump}               -> {launches, mutated, first_ms, ms}
  time    {seeds, warmup, flush_l2, dump_at, spin_us}
                                             -> {host_ms, dev_ms, launch_ms}
  dump    {path, sample?: {count, seed}}     -> {leaves} | error when nothing is kept
  profile {seed}                             -> {gpu_share, kernels}
  env     {}                                 -> {gpu, driver, torch, triton, clocks}

Every reply echoes the command's `id`. A failure is {"ok": false, "error", "tb", "phase"};
the process keeps serving unless the C worker kills it. Outputs are written with tensorio to
the paths the command names (under /io); the C worker compares them. Nothing in a reply
decides correctness: launch counts, mutation and tamper reports are evidence the C worker
combines with its own comparison and its own clock.

`time` on CUDA: per iteration fresh inputs, L2 flush, device sync, then a spin kernel of
spin_us microseconds (torch.cuda._sleep, its cycles per microsecond measured with events at the
first CUDA load; 0 = no spin) on the current stream before the start event, so the events
bracket the call's GPU work and not the host's launch latency (the GPU is still spinning while
the host launches the call). host_ms spans spin and call. The output of iteration dump_at is
kept as a private copy (flattened, tensors cloned: a candidate that reuses one output buffer
across calls still has that call's values compared) and written only by the next `dump`, which
then poisons and frees it; the file write stays out of the time command, which the C worker
clocks. With `sample`, each kept leaf of more than count elements is written as count of its
elements at indices drawn from seed (chosen by the worker after the calls, the same for both
sides) plus its shape: a 256 MiB output costs a 256 KiB file, and a call that skipped its work
still differs in almost every sampled element.
"""
import gc
import json
import os
import sys
import time
import traceback

_perf_ns = time.perf_counter_ns

import torch  # noqa: E402
import triton  # noqa: E402
import triton.runtime.jit as _jit  # noqa: E402

# torch._dynamo rebinds torch.manual_seed (and friends) when it is first imported, which on
# CUDA happens lazily during a run: import it now, before the tamper snapshot below, so that
# torch's own rebinding is not taken for the candidate's.
import torch._dynamo  # noqa: E402,F401

from anvil_harness import static, tasks, tensorio  # noqa: E402

try:
    import triton.runtime.interpreter as _interp
except Exception:  # an older Triton without the interpreter module
    _interp = None

_sync_cuda = torch.cuda.synchronize
_Event = torch.cuda.Event
_event_record = torch.cuda.Event.record
_event_elapsed = torch.cuda.Event.elapsed_time
_clone = torch.Tensor.clone
_equal = torch.equal
_fill = torch.Tensor.fill_
_copy = torch.Tensor.copy_
_randint = torch.randint
_index_select = torch.index_select
_as_tensor = torch.tensor
_reshape = torch.Tensor.reshape
_to = torch.Tensor.to
_sleep = getattr(torch.cuda, "_sleep", None)  # a spin kernel of N SM cycles; None: no spin

# -- launch counter --------------------------------------------------------------------------
_launch = {"on": False, "file": None, "count": 0, "names": set()}


def _wrap_run(cls):
    orig = cls.run

    def run(self, *args, **kwargs):
        if _launch["on"] and not kwargs.get("warmup", False):
            fn = getattr(self, "fn", None)
            code = getattr(fn, "__code__", None)
            if code is not None and code.co_filename == _launch["file"]:
                _launch["count"] += 1
                _launch["names"].add(fn.__name__)
        return orig(self, *args, **kwargs)

    run.__anvil_hook__ = True
    cls.run = run
    return run


_hooks = {"jit": _wrap_run(_jit.JITFunction)}
if _interp is not None and hasattr(_interp, "InterpretedFunction"):
    _hooks["interp"] = _wrap_run(_interp.InterpretedFunction)

# -- tamper check: the objects the harness relies on, by identity -----------------------------
_WATCHED = [(torch.cuda, "synchronize"), (torch.cuda, "Event"), (torch.cuda.Event, "record"),
            (torch.cuda.Event, "elapsed_time"), (time, "perf_counter"),
            (time, "perf_counter_ns"), (time, "time"), (time, "monotonic"),
            (torch, "equal"), (torch, "manual_seed"), (torch.Tensor, "clone"),
            (torch.Tensor, "fill_"), (torch.Tensor, "to"), (torch.Tensor, "cpu"),
            (torch.Tensor, "copy_"), (torch.nn.Module, "__call__"), (_jit.JITFunction, "run")]
if _sleep is not None:
    _WATCHED.append((torch.cuda, "_sleep"))
if _interp is not None and hasattr(_interp, "InterpretedFunction"):
    _WATCHED.append((_interp.InterpretedFunction, "run"))
_SNAPSHOT = [(o, a, o.__dict__.get(a, getattr(o, a))) for o, a in _WATCHED]


def _tampered():
    out = []
    for obj, attr, orig in _SNAPSHOT:
        now = obj.__dict__.get(attr, getattr(obj, attr, None))
        if now is not orig:
            out.append(f"{getattr(obj, '__name__', obj)}.{attr}")
    return out


# -- state of this process --------------------------------------------------------------------
class State:
    runner = None
    device = "cpu"
    flush = None
    inbuf = None  # the input tensors every trial and timed call writes its values into
    kept = None  # [(key, leaf)]: the output `time` kept for the next `dump`, tensors cloned
    spin_rate = 0.0  # torch.cuda._sleep cycles per microsecond (0: unknown, no spin)


S = State()


def _same_buffers(inputs):
    """Returns the inputs for one call, written into the previous call's input tensors when
    they have the same layout, so every trial sees the same addresses with new values: a
    candidate that caches results by data_ptr() then returns a stale (poisoned) result and is
    caught every time, not only when the allocator happens to reuse a block."""
    old = S.inbuf
    fits = old is not None and len(old) == len(inputs) and all(
        (isinstance(o, torch.Tensor) and isinstance(n, torch.Tensor) and o.shape == n.shape
         and o.dtype == n.dtype and o.device == n.device and o.stride() == n.stride())
        or (not isinstance(o, torch.Tensor) and not isinstance(n, torch.Tensor))
        for o, n in zip(old, inputs))
    if not fits:
        S.inbuf = list(inputs)
        return S.inbuf
    out = []
    with torch.no_grad():
        for o, n in zip(old, inputs):
            if isinstance(o, torch.Tensor):
                _copy(o.detach(), n)
                if o.requires_grad != n.requires_grad:
                    o.requires_grad_(n.requires_grad)
                out.append(o)
            else:
                out.append(n)
    S.inbuf = out
    return out


def _sync():
    if S.device.startswith("cuda"):
        _sync_cuda()


def _poison(out):
    """Overwrites floating outputs with NaN before they are freed, so memory reused by a later
    allocation (torch.empty returning last trial's block) cannot pass for a result."""
    _poison_leaves(tensorio.flatten(out))


def _poison_leaves(leaves):
    for _, leaf in leaves:
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.numel():
            try:
                _fill(leaf.detach(), float("nan"))
            except RuntimeError:
                pass


def _clone_all(inputs):
    return [_clone(x) if isinstance(x, torch.Tensor) else x for x in inputs]


def _mutated(inputs, copies):
    for x, c in zip(inputs, copies):
        if isinstance(x, torch.Tensor) and (x.shape != c.shape or x.dtype != c.dtype or not _equal(
                torch.nan_to_num(x.detach()), torch.nan_to_num(c))):
            return True
    return False


def cmd_static(msg):
    kind = msg.get("kind", "kernelbench")
    entries = None
    if kind != "kernelbench":
        _, test = tasks.split_tritonbench(msg["task"])
        entries = tasks.test_entries(test)
    try:
        errors = static.check(msg["code"], kind, entries, msg.get("allow_ops") or ())
    except SyntaxError as e:
        return {"errors": [], "syntax_error": f"line {e.lineno}: {e.msg}"}
    except (RecursionError, MemoryError, ValueError) as e:
        return {"errors": [f"cannot analyse the code: {type(e).__name__}"]}
    return {"errors": errors, "syntax_error": None}


def cmd_load(msg):
    S.device = msg.get("device", "cpu")
    code = msg.get("code")
    cand_file = "/io/candidate.py" if code is not None else None
    _launch["file"] = cand_file
    t0 = _perf_ns()
    S.runner = None
    S.inbuf = None
    S.runner = tasks.make_runner(msg["kind"], msg["task"], S.device, msg.get("init_seed", 0),
                                 msg.get("globals"), code, cand_file)
    S.kept = None
    if S.device.startswith("cuda") and S.flush is None:
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20)
        S.flush = torch.empty(max(2 * l2, 1 << 20) // 4, dtype=torch.int32, device=S.device)
        S.spin_rate = _spin_rate()
    return {"load_ms": (_perf_ns() - t0) / 1e6}


def _spin_rate():
    """Cycles of torch.cuda._sleep per microsecond on this GPU, measured with events: its unit
    is the SM clock, which not every CUDA version's device properties report. The fastest of a
    few spins counts (the clock ramps up from idle), so at a lower clock a spin only lasts
    longer. 0.0 (timing without a spin, as before it existed) when there is no _sleep, it
    fails (a torch built without it) or the events say nothing usable."""
    if _sleep is None:
        return 0.0
    n, best = 1 << 20, 0.0
    start, end = _Event(enable_timing=True), _Event(enable_timing=True)
    try:
        _sleep(1000)
        for _ in range(3):
            _event_record(start)
            _sleep(n)
            _event_record(end)
            _sync_cuda()
            ms = _event_elapsed(start, end)
            if ms > 0:
                best = max(best, n / (ms * 1000.0))
    except RuntimeError:
        return 0.0
    return best if 10.0 <= best <= 100000.0 else 0.0


def _call_counted(inputs):
    _launch["count"] = 0
    _launch["on"] = True
    try:
        out = S.runner.call(inputs)
        _sync()
    finally:
        _launch["on"] = False
    return out, _launch["count"]


def cmd_trials(msg):
    launches, mutated, ms, first_ms = [], [], [], None
    modes = msg.get("modes") or []
    for i, seed in enumerate(msg["seeds"]):
        S.runner.set_train(bool(modes[i]) if i < len(modes) else False)
        inputs = _same_buffers(S.runner.make_inputs(seed))
        copies = _clone_all(inputs)
        _sync()
        t0 = _perf_ns()
        out, n = _call_counted(inputs)
        dt = (_perf_ns() - t0) / 1e6
        if first_ms is None:
            first_ms = dt
        ms.append(dt)
        launches.append(n)
        mutated.append(_mutated(inputs, copies))
        tensorio.write(msg["dump"][i], out)
        _poison(out)
        del out, inputs, copies
    S.runner.set_train(False)
    return {"launches": launches, "mutated": mutated, "first_ms": first_ms, "ms": ms,
            "kernels": sorted(_launch["names"])}


def _keep(out):
    """A private copy of one call's output for `dump`: flattened, every tensor cloned."""
    return [(k, _clone(v.detach()) if isinstance(v, torch.Tensor) else v)
            for k, v in tensorio.flatten(out)]


def cmd_time(msg):
    """The timed calls. Python's cyclic collector is off during them (a collection inside a
    call's host path delays its launches past the spin); launch_ms is each call's host time
    from the spin's launch to the call's return, before the end event: above the spin it says
    the GPU waited for the host inside the interval the events measured."""
    host, dev, launch = [], [], []
    cuda = S.device.startswith("cuda")
    S.kept = None
    spin = int(msg.get("spin_us", 0) * S.spin_rate) if cuda and _sleep is not None else 0
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(msg.get("warmup", 0)):
            out = S.runner.call(_same_buffers(S.runner.make_inputs(msg["seeds"][0])))
            _sync()
            del out
        dump_at = msg.get("dump_at", -1)
        for i, seed in enumerate(msg["seeds"]):
            inputs = _same_buffers(S.runner.make_inputs(seed))
            if cuda and msg.get("flush_l2", True) and S.flush is not None:
                S.flush.zero_()
            _sync()
            if cuda:
                start, end = _Event(enable_timing=True), _Event(enable_timing=True)
                h0 = _perf_ns()
                if spin > 0:
                    _sleep(spin)
                _event_record(start)
                out = S.runner.call(inputs)
                hl = _perf_ns()
                _event_record(end)
                _sync()
                h1 = _perf_ns()
                dev.append(_event_elapsed(start, end))
                launch.append((hl - h0) / 1e6)
            else:
                h0 = _perf_ns()
                out = S.runner.call(inputs)
                h1 = _perf_ns()
            host.append((h1 - h0) / 1e6)
            if i == dump_at:
                S.kept = _keep(out)
            del out, inputs
    finally:
        if gc_was:
            gc.enable()
    return {"host_ms": host, "dev_ms": dev if cuda else None,
            "launch_ms": launch if cuda else None}


def cmd_dump(msg):
    """Writes the output the last `time` kept to msg["path"], then poisons and frees it: one
    dump per time command; with nothing kept (no time before, dump_at outside the batch, or
    already dumped) an error, and the process keeps serving."""
    kept, S.kept = S.kept, None
    if kept is None:
        raise RuntimeError("dump: no output kept (a time command with dump_at comes first)")
    try:
        leaves = _sampled(kept, msg["sample"]) if msg.get("sample") else kept
        n = tensorio.write_leaves(msg["path"], leaves)
    finally:
        _poison_leaves(kept)
    return {"leaves": n}


def _sampled(leaves, sample):
    """Each tensor leaf of more than sample["count"] elements becomes two: KEY#shape (its
    shape, int64) and KEY#sample (count elements of its flattened values at indices drawn
    from sample["seed"] and the leaf's position); smaller leaves stay whole."""
    count, seed = int(sample["count"]), int(sample["seed"])
    out = []
    for j, (key, leaf) in enumerate(leaves):
        if isinstance(leaf, torch.Tensor) and leaf.numel() > count > 0:
            g = torch.Generator(device="cpu")
            g.manual_seed((seed + 7919 * j) % (1 << 63))
            idx = _randint(0, leaf.numel(), (count,), generator=g, dtype=torch.int64)
            flat = _reshape(leaf.detach(), -1)
            out.append((key + "#shape", _as_tensor(list(leaf.shape), dtype=torch.int64)))
            out.append((key + "#sample", _index_select(flat, 0, _to(idx, flat.device))))
        else:
            out.append((key, leaf))
    return out


def cmd_profile(msg):
    if not S.device.startswith("cuda"):
        return {"gpu_share": None}
    from torch.profiler import ProfilerActivity, profile
    inputs = S.runner.make_inputs(msg["seed"])
    _sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = S.runner.call(inputs)
        _sync()
    names = set(_launch["names"])
    total = mine = 0.0
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)
        if ev.key.startswith(("cudaLaunch", "cudaDevice", "Memcpy", "Memset")):
            continue
        if getattr(ev, "device_type", None) is not None and "CUDA" not in str(ev.device_type):
            continue
        total += t
        if any(ev.key.startswith(n) for n in names):
            mine += t
    del out
    return {"gpu_share": (mine / total) if total > 0 else 0.0, "kernels": sorted(names)}


def cmd_env(msg):
    env = {"torch": torch.__version__, "triton": triton.__version__,
           "device": "cuda" if msg.get("device", "cpu").startswith("cuda") else "cpu",
           "python": sys.version.split()[0]}
    if env["device"] == "cuda" and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env["gpu"] = p.name
        env["driver"] = str(torch.version.cuda)
        try:
            env["clocks"] = f"sm_clock_mhz={torch.cuda.clock_rate()}"  # torch: MHz
        except Exception:
            env["clocks"] = ""
        env["clocks"] += f" spin_cycles_per_us={S.spin_rate:.0f}"
    else:
        env["gpu"] = "cpu"
        env["clocks"] = "triton-interpret" if os.environ.get("TRITON_INTERPRET") == "1" else ""
    return env


COMMANDS = {"static": cmd_static, "load": cmd_load, "trials": cmd_trials, "time": cmd_time,
            "dump": cmd_dump, "profile": cmd_profile, "env": cmd_env}
PHASE = {"load": "compile", "trials": "run", "time": "run", "dump": "run", "profile": "run"}


def _reply(fd, obj):
    data = (json.dumps(obj, default=str) + "\n").encode()
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def main(argv):
    cmd_fd, reply_fd = int(argv[0]), int(argv[1])
    sys.setrecursionlimit(4000)
    _reply(reply_fd, {"event": "ready", "pid": os.getpid(), "torch": torch.__version__,
                      "triton": triton.__version__})
    stream = os.fdopen(cmd_fd, "rb", buffering=0)
    buf = b""
    while True:
        chunk = stream.read(1 << 16)
        if not chunk:
            return 0
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            msg = json.loads(line)
            name = msg.get("cmd")
            rep = {"id": msg.get("id"), "ok": True}
            try:
                rep.update(COMMANDS[name](msg))
            except BaseException as e:  # noqa: B036 - candidate code may raise SystemExit
                if isinstance(e, KeyboardInterrupt):
                    raise
                rep = {"id": msg.get("id"), "ok": False, "phase": PHASE.get(name, "run"),
                       "error": f"{type(e).__name__}: {e}"[:500],
                       "tb": "".join(traceback.format_exception(e))[-4000:]}
            rep["tampered"] = _tampered()
            _reply(reply_fd, rep)
