"""tasks.py - load a task (reference or candidate side) into a runner the server can drive.

A runner has make_inputs(seed) -> inputs (fresh tensors, created on the device), call(inputs)
-> output, set_train(bool), and kernels_file (the file name the candidate's kernels are
compiled from, for the launch counter). Kinds:

- kernelbench: the task source defines Model, get_inputs, get_init_inputs. The reference
  runner builds Model; the candidate runner builds the candidate's ModelNew. Both take their
  inputs and init inputs from the task source with the same seeds, so a candidate sees exactly
  the inputs the reference saw without any tensor crossing between the processes. `globals`
  overrides module constants (batch_size, dim, ...) so CI can run level-1 tasks at small sizes.
- tritonbench-g / tritonbench-t: the file is reference code, a line of '#', and a test. The
  test's test_* function returns the `results` the outputs are compared by; module-level
  calls of the test are removed. The candidate runner executes the candidate code, then the
  test code in the same namespace, so the test calls the candidate's functions.

On device "cpu", tasks written for CUDA (TritonBench tests say device='cuda') run under
CudaToCpu, a TorchFunctionMode that maps CUDA devices to the CPU: the CI path, where Triton
runs in its interpreter.
"""
import linecache
import os
import ast
import re
import types

import torch

SEPARATOR = re.compile(r"^#{40,}\s*$", re.M)


class CudaToCpu(torch.overrides.TorchFunctionMode):
    """Maps device='cuda' arguments, .cuda() and .to('cuda') to the CPU (CI emulation)."""

    @staticmethod
    def _fix(d):
        if isinstance(d, str) and d.startswith("cuda"):
            return "cpu"
        if isinstance(d, torch.device) and d.type == "cuda":
            return torch.device("cpu")
        return d

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if getattr(func, "__name__", "") == "__get__" and "is_cuda" in repr(func):
            return True
        if "device" in kwargs:
            kwargs["device"] = self._fix(kwargs["device"])
        if func in (torch.Tensor.to,):
            args = tuple(self._fix(a) for a in args)
        return func(*args, **kwargs)


def split_tritonbench(source):
    """(reference code, test code) of a TritonBench file, split at the LAST separator line:
    some references (quantize_kv_copy.py) hold a '#' line of their own, and the importer
    (cli/cli_import.c) splits the same way."""
    found = list(SEPARATOR.finditer(source))
    m = found[-1] if found else None
    if not m:
        raise ValueError("no separator line of '#' between reference and test")
    return source[:m.start()], source[m.end():]


def strip_test(test_code):
    """Test code without module-level statements that run the test; returns (code, tests)."""
    tree = ast.parse(test_code)
    tests = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)
             and n.name.startswith("test")]
    keep = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)):
            keep.append(node)
        elif isinstance(node, ast.Assign) and not any(
                isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id in tests
                for c in ast.walk(node.value)):
            keep.append(node)
    if not tests:
        raise ValueError("the test code defines no test_* function")
    return ast.unparse(ast.Module(body=keep, type_ignores=[])), tests


def test_entries(test_code):
    """Names the test functions call: the entry points of a TritonBench candidate."""
    tree = ast.parse(test_code)
    names = set()
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test"):
            for node in ast.walk(fn):
                if isinstance(node, ast.Call):
                    f = node.func
                    if isinstance(f, ast.Name):
                        names.add(f.id)
                    elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                        names.add(f.value.id)
                        names.add(f"{f.value.id}.{f.attr}")
                        if f.attr == "apply":
                            names.add(f"{f.value.id}.forward")
    return sorted(names)


def _module(name, code, filename, extra=None):
    # Triton's @jit reads its function's source through inspect (the interpreter used on the
    # CPU does not, which is why only the GPU path needs this): register the code under its
    # file name so inspect.getsourcelines() finds it without a file on disk.
    # Only off the interpreter: under TRITON_INTERPRET=1 a registered source changes how
    # TritonBench references are re-parsed (their test code runs under the same file name) and
    # broke add_example; the interpreter does not need it.
    if os.environ.get("TRITON_INTERPRET") != "1":
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    mod = types.ModuleType(name)
    mod.__file__ = filename
    if extra:
        mod.__dict__.update(extra)
    exec(compile(code, filename, "exec"), mod.__dict__)
    return mod


def _to_device(x, device):
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (list, tuple)):
        return type(x)(_to_device(v, device) for v in x)
    return x


class KernelBenchRunner:
    def __init__(self, task_src, device, init_seed, overrides, cand_src=None, cand_file=None):
        self.device = device
        self.task = _module("anvil_task", task_src, "/io/task.py")
        for k, v in (overrides or {}).items():
            setattr(self.task, k, v)
        self.kernels_file = cand_file
        if cand_src is not None:
            self.cand = _module("anvil_candidate", cand_src, cand_file)
            cls = getattr(self.cand, "ModelNew", None)
            if cls is None:
                raise NameError("the candidate defines no ModelNew")
        else:
            cls = self.task.Model
        torch.manual_seed(init_seed)
        with torch.device(device):
            init = self.task.get_init_inputs()
        init = _to_device(init, device)
        torch.manual_seed(init_seed)
        with torch.device(device):
            self.model = cls(*init)
        self.model = self.model.to(device)
        self.model.eval()

    def make_inputs(self, seed):
        torch.manual_seed(seed)
        with torch.device(self.device):
            inputs = self.task.get_inputs()
        return _to_device(list(inputs), self.device)

    def call(self, inputs):
        with torch.no_grad():
            return self.model(*inputs)

    def set_train(self, on):
        self.model.train(on)


class TritonBenchRunner:
    def __init__(self, task_src, device, cand_src=None, cand_file=None):
        self.device = device
        ref_code, test_code = split_tritonbench(task_src)
        test_code, tests = strip_test(test_code)
        self.kernels_file = cand_file
        self.mode = CudaToCpu() if device == "cpu" else None
        with self._mode():
            if cand_src is None:
                mod = _module("anvil_task", ref_code, "/io/task.py")
            else:
                mod = _module("anvil_candidate", cand_src, cand_file)
            exec(compile(test_code, "/io/test.py", "exec"), mod.__dict__)
        self.mod = mod
        self.test = getattr(mod, tests[0])

    def _mode(self):
        return self.mode if self.mode is not None else _Null()

    def make_inputs(self, seed):
        torch.manual_seed(seed)
        return []

    def call(self, inputs):
        with self._mode():
            return self.test()

    def set_train(self, on):
        pass


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def make_runner(kind, task_src, device, init_seed=0, overrides=None, cand_src=None,
                cand_file=None):
    if kind == "kernelbench":
        return KernelBenchRunner(task_src, device, init_seed, overrides, cand_src, cand_file)
    if kind in ("tritonbench-g", "tritonbench-t"):
        return TritonBenchRunner(task_src, device, cand_src, cand_file)
    raise ValueError(f"unknown task kind '{kind}'")
