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
def k(x_ptr:
    pass
```
