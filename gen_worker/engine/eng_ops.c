/*  eng_ops.c - dtype helpers and the backend factory of eng_ops.h.

    The factory is the only place that knows the list of backends; "cuda" exists only when the
    engine is built with ANVIL_CUDA (ENG_HAVE_CUDA), otherwise it is refused by name.
*/
#include "eng_ops.h"

#include <string.h>

#include "anv_log.h"
#include "cpu/eng_cpu.h"
#ifdef ENG_HAVE_CUDA
#include "cuda/eng_cuda.h"
#endif

size_t eng_dtype_size(eng_dtype_t dtype)
{
    switch (dtype) {
    case ENG_DTYPE_F32:
        return 4;
    case ENG_DTYPE_F16:
    case ENG_DTYPE_BF16:
        return 2;
    }
    return 0;
}

const char *eng_dtype_name(eng_dtype_t dtype)
{
    switch (dtype) {
    case ENG_DTYPE_F32:
        return "F32";
    case ENG_DTYPE_F16:
        return "F16";
    case ENG_DTYPE_BF16:
        return "BF16";
    }
    return "?";
}

eng_backend_t *eng_backend_new(const char *name, int n_threads)
{
    if (!name || strcmp(name, "cpu") == 0)
        return eng_cpu_backend_new(n_threads);
#ifdef ENG_HAVE_CUDA
    if (strcmp(name, "cuda") == 0)
        return eng_cuda_backend_new();
#endif
    if (strcmp(name, "cuda") == 0)
        ANV_ERROR("backend 'cuda' is not built into this binary (configure with -DANVIL_CUDA=ON)");
    else
        ANV_ERROR("unknown backend '%s' (known: cpu, cuda)", name);
    return NULL;
}
