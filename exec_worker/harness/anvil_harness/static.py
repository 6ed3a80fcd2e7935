"""static.py - static checks of candidate code with Python's ast, before any of it runs.

Runs in the reference process (which never executes candidate code), so a candidate rejected
here never costs a sandboxed interpreter. The checks are a policy, not the sandbox: they stop
the honest-looking cheats (torch fallbacks behind try/except, patched timers, decoy kernels,
side streams, pointer caches) with a readable reason; the sandbox stops what slips through.

Rules (each violation is one message "line N: ..."):
- a @triton.jit kernel exists and is launched (kernel[grid](...)) from the entry points: the
  forward path of ModelNew (KernelBench) or the functions the TritonBench test calls;
- no try/except (a fallback to torch hides behind one) and no contextlib.suppress;
- no class derived from the reference `Model`;
- no import of modules for threads, processes, network, files, timers, ctypes, introspection;
- no builtins that reach files, code or frames (open, exec, eval, __import__, getattr on a
  computed name, setattr, globals, ...) and no dunder attribute access;
- no attribute named like a stream, event, synchronize, timer, CUDA graph or raw pointer;
- no assignment to an attribute of a library module (torch.cuda.synchronize = ...);
- torch calls reachable from the entry points are limited to an allow-list (allocation,
  shapes, dtypes); compute (torch.matmul, F.relu, x.sum(), ...) must be in Triton.
"""
import ast

BANNED_MODULES = {
    "threading", "_thread", "multiprocessing", "concurrent", "subprocess", "socket", "ssl",
    "http", "urllib", "urllib3", "requests", "asyncio", "selectors", "select", "shutil",
    "pathlib", "tempfile", "glob", "io", "ctypes", "cffi", "signal", "importlib", "builtins",
    "gc", "inspect", "pickle", "marshal", "shelve", "time", "timeit", "resource", "mmap",
    "pty", "fcntl", "sys", "os", "posix", "atexit", "code", "codeop", "runpy", "pdb",
    "traceback", "weakref", "faulthandler", "psutil", "zipimport", "webbrowser", "ftplib",
    "smtplib", "telnetlib", "xmlrpc", "sqlite3", "dbm", "zmq", "numba", "cupy", "pycuda",
}
BANNED_NAMES = {
    "open", "exec", "eval", "compile", "__import__", "globals", "locals", "vars", "setattr",
    "delattr", "breakpoint", "input", "exit", "quit", "memoryview", "__builtins__",
    "__loader__", "__spec__", "help", "copyright", "credits", "license",
}
BANNED_ATTRS = {
    "Stream", "stream", "streams", "Event", "synchronize", "set_stream", "current_stream",
    "default_stream", "wait_stream", "wait_event", "record_stream", "elapsed_time",
    "ExternalStream", "CUDAGraph", "graph", "graphs", "make_graphed_callables",
    "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "process_time",
    "thread_time", "clock_gettime", "data_ptr", "untyped_storage", "storage", "_cdata",
    "from_file", "fromfile", "tofile", "hub", "fork", "system", "popen", "spawn", "kill",
    "killpg", "_exit", "environ", "putenv", "cpp_extension", "load_inline", "multiprocessing",
    "distributed", "profiler", "_C", "set_default_device", "manual_seed", "set_rng_state",
    "get_rng_state",
}
# dotted prefixes banned wherever they appear (names that are fine elsewhere, e.g. tl.load)
BANNED_DOTTED = ("torch.load", "torch.save", "torch.compile", "torch.ops", "torch.library",
                 "torch.jit", "np.load", "np.save", "numpy.load", "numpy.save", "torch.backends",
                 "triton.runtime", "triton.compiler", "triton.knobs", "triton.testing")
TIMED_MODULES = {"torch", "triton", "tl", "time", "F", "nn", "np", "numpy", "math", "os",
                 "sys", "functional"}
# torch.X / F.X / torch.nn.functional.X calls allowed on the forward path
TORCH_ALLOWED = {
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like",
    "full", "full_like", "arange", "tensor", "as_tensor", "Size", "device", "finfo", "iinfo",
    "is_tensor", "is_floating_point", "numel", "cdiv", "next_power_of_2", "get_default_dtype",
    "no_grad", "inference_mode", "enable_grad", "is_grad_enabled", "promote_types",
    "result_type", "broadcast_shapes",
}
# tensor methods that compute: not allowed on the forward path (shape/layout methods are)
COMPUTE_METHODS = {
    "relu", "relu_", "sigmoid", "tanh", "softmax", "log_softmax", "matmul", "mm", "bmm",
    "addmm", "baddbmm", "conv1d", "conv2d", "conv3d", "sum", "mean", "prod", "cumsum",
    "cumprod", "exp", "log", "sqrt", "rsqrt", "pow", "max", "min", "amax", "amin", "argmax",
    "argmin", "norm", "var", "std", "gelu", "silu", "softplus", "clamp", "clamp_", "abs",
    "einsum", "linear", "layer_norm", "group_norm", "batch_norm", "instance_norm", "dropout",
    "cross_entropy", "mse_loss", "l1_loss", "smooth_l1_loss", "kl_div", "logsumexp", "sort",
    "topk", "cummax", "cummin", "mul", "add", "sub", "div", "where", "maximum", "minimum",
    "erf", "sin", "cos", "elu", "selu", "leaky_relu", "hardtanh", "hardsigmoid", "softsign",
    "mv", "dot", "outer", "tensordot", "scaled_dot_product_attention", "avg_pool1d",
    "avg_pool2d", "avg_pool3d", "max_pool1d", "max_pool2d", "max_pool3d", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "triplet_margin_loss", "huber_loss",
    "cosine_similarity", "pairwise_distance", "rms_norm", "normalize", "square", "neg",
}
TORCH_NAMES = {"torch", "F", "functional", "nn"}


def _dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _is_jit_decorator(dec):
    target = dec.func if isinstance(dec, ast.Call) else dec
    name = _dotted(target) or ""
    return name.split(".")[-1] in ("jit", "autotune", "heuristics") and (
        "triton" in name or name in ("jit", "autotune", "heuristics") or name.startswith("tl."))


class _Module:
    def __init__(self, tree):
        self.kernels = set()        # names of @triton.jit functions
        self.functions = {}         # name -> FunctionDef (methods as Class.name and name)
        self.classes = {}           # name -> ClassDef
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self.functions[f"{node.name}.{item.name}"] = item
                        self.functions.setdefault(item.name, item)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if any(_is_jit_decorator(d) for d in node.decorator_list):
                    self.kernels.add(node.name)
                self.functions.setdefault(node.name, node)
        # kernels also made by assignment: k = triton.jit(f)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                if _is_jit_decorator(node.value):
                    for t in node.targets:
                        if isinstance(t, ast.Name):
                            self.kernels.add(t.id)

    def callees(self, fn, cls=None):
        """Names a function calls or refers to, and whether it launches a kernel itself."""
        names, launches = set(), False
        for node in ast.walk(fn):
            if isinstance(node, ast.Call):
                f = node.func
                if isinstance(f, ast.Subscript):
                    base = _dotted(f.value) or ""
                    if base.split(".")[-1] in self.kernels:
                        launches = True
                elif isinstance(f, ast.Attribute):
                    base = _dotted(f.value)
                    if f.attr in ("apply", "forward") and base in self.classes:
                        names.add(f"{base}.forward")
                    if f.attr == "run" and base in self.kernels:
                        launches = True
                    if base in ("self", "cls") and cls:
                        names.add(f"{cls}.{f.attr}")
                    names.add(f.attr)
                elif isinstance(f, ast.Name):
                    if f.id in self.classes:
                        names.add(f"{f.id}.__init__")
                        names.add(f"{f.id}.forward")
                        names.add(f"{f.id}.__call__")
                    names.add(f.id)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                names.add(node.id)  # functions passed around (e.g. lambdas, callbacks)
        return names, launches

    def owner(self, key):
        return key.split(".")[0] if "." in key else None

    def reachable(self, entries):
        """Set of function keys reachable from entries, and whether a kernel launch is."""
        seen, todo, launched = set(), [e for e in entries if e in self.functions], False
        while todo:
            key = todo.pop()
            if key in seen:
                continue
            seen.add(key)
            fn = self.functions[key]
            if fn.name in self.kernels:
                continue
            cls = self.owner(key)
            if cls is None:
                for cname, cnode in self.classes.items():
                    if fn in cnode.body:
                        cls = cname
            names, launches = self.callees(fn, cls)
            launched = launched or launches
            for n in names:
                if n in self.functions and n not in seen:
                    todo.append(n)
        return seen, launched


def _rules(tree, errors):
    imported = set(TIMED_MODULES)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for m in mods:
                if m.split(".")[0] in BANNED_MODULES:
                    errors.append(f"line {line}: import of '{m}' is not allowed")
            for a in node.names:
                imported.add((a.asname or a.name).split(".")[0])
                if a.name in BANNED_ATTRS or a.name in BANNED_NAMES:
                    errors.append(f"line {line}: import of '{a.name}' is not allowed")
        elif isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            errors.append(f"line {line}: try/except is not allowed (no fallback paths)")
        elif isinstance(node, ast.Name) and node.id in BANNED_NAMES:
            errors.append(f"line {line}: use of '{node.id}' is not allowed")
        elif isinstance(node, ast.Attribute):
            if node.attr.startswith("__") and node.attr.endswith("__") and node.attr not in (
                    "__init__", "__name__"):
                errors.append(f"line {line}: dunder attribute '{node.attr}' is not allowed")
            elif node.attr in BANNED_ATTRS:
                errors.append(f"line {line}: attribute '{node.attr}' is not allowed")
            elif (_dotted(node) or "").startswith(BANNED_DOTTED):
                errors.append(f"line {line}: '{_dotted(node)}' is not allowed")
            elif node.attr == "suppress":
                errors.append(f"line {line}: contextlib.suppress is not allowed")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "getattr" and (len(node.args) < 2 or not isinstance(
                    node.args[1], ast.Constant) or not isinstance(node.args[1].value, str)):
                errors.append(f"line {line}: getattr with a computed name is not allowed")
            elif node.func.id == "getattr" and (node.args[1].value in BANNED_ATTRS
                                                or node.args[1].value.startswith("__")):
                errors.append(f"line {line}: getattr of '{node.args[1].value}' is not allowed")
        elif isinstance(node, ast.ClassDef):
            for b in node.bases:
                if (_dotted(b) or "").split(".")[-1] == "Model":
                    errors.append(f"line {line}: class '{node.name}' inherits the reference Model")
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Attribute):
                        root = (_dotted(sub) or "").split(".")[0]
                        if root in imported:
                            errors.append(f"line {line}: assignment to '{_dotted(sub)}' "
                                          "rebinds a library attribute")


def _torch_calls(mod, keys, allow, errors):
    """Compute torch calls in the non-kernel functions of keys."""
    for key in sorted(keys):
        fn = mod.functions[key]
        if fn.name in mod.kernels:
            continue
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            name = _dotted(node.func) or ""
            root = name.split(".")[0]
            attr = node.func.attr
            if attr in allow:
                continue
            if root in TORCH_NAMES and attr not in TORCH_ALLOWED and not name.startswith(
                    ("torch.nn.Parameter", "nn.Parameter", "torch.float", "torch.int")):
                if name.startswith(("torch.", "F.", "nn.functional.", "functional.")) and (
                        not name.startswith("torch.nn.") or name.startswith("torch.nn.functional")):
                    errors.append(f"line {node.lineno}: torch op '{name}' on the forward path "
                                  "(compute must be in Triton)")
            elif root not in TORCH_NAMES and attr in COMPUTE_METHODS and root not in (
                    "tl", "triton", "math") and (_dotted(node.func.value) or "x").split(".")[-1] not in mod.kernels:
                errors.append(f"line {node.lineno}: tensor op '.{attr}()' on the forward path "
                              "(compute must be in Triton)")


def check(code, kind="kernelbench", entries=None, allow_ops=()):
    """Returns a list of violation messages (empty = accepted).

    kind: kernelbench (entry ModelNew.forward) or tritonbench-g/-t (entries = the names the
    test calls, given by the caller). allow_ops: extra torch ops allowed on the forward path;
    "*" turns the op check off. A SyntaxError is raised to the caller (a compile error).
    """
    tree = ast.parse(code)
    errors = []
    _rules(tree, errors)
    mod = _Module(tree)
    if not mod.kernels:
        errors.append("no @triton.jit kernel is defined")
    if kind == "kernelbench":
        if "ModelNew" not in mod.classes:
            errors.append("no class ModelNew is defined")
        entries = ["ModelNew.forward"]
    entries = [e for e in (entries or []) if e in mod.functions]
    if mod.kernels and not entries:
        errors.append("none of the entry points is defined: " + ", ".join(entries or ["?"]))
    elif mod.kernels:
        keys, launched = mod.reachable(entries)
        if not launched:
            errors.append("no Triton kernel is launched from " + ", ".join(entries))
        if "*" not in allow_ops:
            _torch_calls(mod, keys, set(allow_ops), errors)
    seen, out = set(), []
    for e in errors:
        if e not in seen:
            seen.add(e)
            out.append(e)
    return out
