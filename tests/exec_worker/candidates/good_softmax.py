<think>
Let me write a kernel.
```python
print("not this block")
```
</think>
Answer:

```python
import torch
import torch.nn as nn
import triton
import triton.language as tl

@triton.jit
def softmax_kernel(x_ptr, y_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float('inf'))
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, axis=0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        rows, cols = x.shape
        softmax_kernel[(rows,)](x, y, cols, x.stride(0), BLOCK=triton.next_power_of_2(cols))
        return y
```
