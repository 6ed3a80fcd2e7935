<think>
I will write
```python
import torch
```
