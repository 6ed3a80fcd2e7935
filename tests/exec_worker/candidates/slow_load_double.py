A pure-torch candidate for tasks/sleepy_double.py that takes 3 s to load (the sleep stands
for a slow import and JIT compile). It needs the static checks (no `time`) and the Triton
launch rule off.

```python
import time

import torch.nn as nn

time.sleep(3.0)


class ModelNew(nn.Module):
    def forward(self, x):
        return x * 2
```
