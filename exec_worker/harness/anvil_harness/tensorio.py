"""tensorio.py - write task outputs as flat tensor records for the C worker to compare.

An output (tensor, tuple, list, dict, scalar, string, None) is flattened into leaves with a
path key ("0", "test_case_1/1", ...). Each leaf is one record:

    u32 magic 'ANVT' | u32 dtype | u32 ndim | u32 keylen | u64 nbytes | i64 shape[ndim]
    | key bytes | pad to 8 | data (C-contiguous, little-endian) | pad to 8

dtype codes are shared with exec_worker/exec_tensor.h. Scalars become 0-d records, strings are
UTF-8 bytes, None has no data. Complex tensors are written as their real view (an extra
trailing dimension of 2). Other dtypes (float8, ...) are widened to float32 and keep their own
code so a dtype change is still seen.

A CUDA leaf reaches the host through one pinned staging buffer per process, grown as needed
and reused by every record (the write of a record ends before the next is staged): a 256 MiB
output is copied at the link's rate instead of into freshly allocated pageable memory.
"""
import struct

import torch

MAGIC = 0x54564E41  # 'ANVT' little-endian
F32, F64, F16, BF16, I8, I16, I32, I64, U8, BOOL, STR, NONE, C64, C128, F8_E4M3, F8_E5M2 = range(1, 17)
_CODES = {
    torch.float32: F32, torch.float64: F64, torch.float16: F16, torch.bfloat16: BF16,
    torch.int8: I8, torch.int16: I16, torch.int32: I32, torch.int64: I64, torch.uint8: U8,
    torch.bool: BOOL, torch.complex64: C64, torch.complex128: C128,
}
for _name, _code in (("float8_e4m3fn", F8_E4M3), ("float8_e5m2", F8_E5M2)):
    if hasattr(torch, _name):
        _CODES[getattr(torch, _name)] = _code


def flatten(obj, prefix="", out=None, depth=0):
    """Returns [(key, leaf)] for a nested output; raises TypeError on unsupported leaves."""
    if out is None:
        out = []
    if depth > 16:
        raise TypeError("output nested deeper than 16 levels")
    if isinstance(obj, torch.Tensor) or obj is None or isinstance(obj, (bool, int, float, str)):
        out.append((prefix or "0", obj))
    elif isinstance(obj, dict):
        for k in obj:
            flatten(obj[k], f"{prefix}/{k}" if prefix else str(k), out, depth + 1)
    elif isinstance(obj, (list, tuple)):
        if not obj:
            out.append((prefix or "0", "<empty>"))
        for i, v in enumerate(obj):
            flatten(v, f"{prefix}/{i}" if prefix else str(i), out, depth + 1)
    elif isinstance(obj, torch.Size):
        out.append((prefix or "0", torch.tensor(list(obj), dtype=torch.int64)))
    else:
        raise TypeError(f"unsupported output type {type(obj).__name__} at '{prefix or '0'}'")
    return out


_stage = None  # pinned host bytes for device-to-host copies (see the module's docstring)


def _to_host(t):
    """A contiguous CPU tensor with t's values: t itself when already there, else a view of
    the staging buffer, valid until the next call."""
    global _stage
    if t.device.type != "cuda":
        return t.contiguous()
    n = t.numel() * t.element_size()
    if _stage is None or _stage.numel() < n:
        _stage = None  # the old buffer is released before the larger one is pinned
        _stage = torch.empty(max(n, 1 << 20), dtype=torch.uint8, pin_memory=True)
    host = _stage[:n].view(t.dtype).view(t.shape)
    host.copy_(t)  # blocking: the bytes are on the host when this returns
    return host


def _record(key, leaf):
    """Returns (head, data, pad) of one record; data is a memoryview of the leaf's CPU bytes
    (no copy for a CPU tensor that is already contiguous)."""
    kb = key.encode("utf-8", "replace")[:255]
    shape = ()
    if leaf is None:
        code, data = NONE, b""
    elif isinstance(leaf, str):
        code, data = STR, leaf.encode("utf-8", "replace")
    elif isinstance(leaf, bool):
        code, data = BOOL, struct.pack("<B", int(leaf))
    elif isinstance(leaf, int):
        code, data = I64, struct.pack("<q", max(min(leaf, 2**63 - 1), -(2**63)))
    elif isinstance(leaf, float):
        code, data = F64, struct.pack("<d", leaf)
    else:
        t = leaf.detach()
        code = _CODES.get(t.dtype)
        if code is None:
            raise TypeError(f"unsupported dtype {t.dtype} at '{key}'")
        shape = tuple(t.shape)
        if code in (C64, C128):
            t = torch.view_as_real(t)
        elif code in (F8_E4M3, F8_E5M2):
            t = t.float()
        t = _to_host(t)
        data = memoryview(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else b""
    n = len(data)
    head = struct.pack("<IIIIQ", MAGIC, code, len(shape), len(kb), n)
    head += struct.pack(f"<{len(shape)}q", *shape) + kb
    head += b"\0" * (-len(head) % 8)
    return head, data, b"\0" * (-n % 8)


def write(path, obj):
    """Writes the flattened output to path; returns the number of leaves. Each leaf's bytes
    go to the file straight from its CPU copy (a 256 MiB output is written at memory speed,
    not concatenated into new byte strings first)."""
    return write_leaves(path, flatten(obj))


def write_leaves(path, leaves):
    """write() of an output already flattened into [(key, leaf)]."""
    with open(path, "wb") as f:
        for key, leaf in leaves:
            for part in _record(key, leaf):
                f.write(part)
    return len(leaves)


def fingerprint(obj):
    """Cheap float64 (sum, abs-sum) over every tensor leaf, for checks during timing."""
    s = a = 0.0
    for _, leaf in flatten(obj):
        if isinstance(leaf, torch.Tensor) and leaf.numel():
            t = leaf.detach()
            if t.is_complex():
                t = torch.view_as_real(t)
            t = t.double()
            s += float(torch.nan_to_num(t).sum())
            a += float(torch.nan_to_num(t).abs().sum())
        elif isinstance(leaf, (int, float)) and not isinstance(leaf, bool):
            s += float(leaf)
            a += abs(float(leaf))
    return [s, a]
