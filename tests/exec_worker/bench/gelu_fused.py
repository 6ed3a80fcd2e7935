A fused Triton version of the tanh GELU: one pass over memory instead of the reference's
chain of elementwise kernels.

```python
import math

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def gelu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    a = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    t = 1.0 - 2.0 / (1.0 + tl.exp(2.0 * a))
    tl.store(y_ptr + offs, 0.5 * x * (1.0 + t), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        gelu_kernel[(triton.cdiv(n, 4096),)](x, y, n, BLOCK=4096, num_warps=8)
        return y
```
