A kernel that is right in the correctness trials and in the check after timing, and wrong only
in the first timing round: with --trials 5 --warmup 0 --batch 3 its calls 6 to 8 are exactly
that round's timed calls, so only the round's compared output can catch it.

```python
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.maximum(x, 0.0) * scale, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        scale = 2.0 if 6 <= self.calls <= 8 else 1.0
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), scale, BLOCK=1024)
        return y
```
