/*  eng_safetensors.h - a read-only, mmap'd safetensors file.

    Format: an 8-byte little-endian header length N, N bytes of JSON {"name": {"dtype": "BF16",
    "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data, offsets
    relative to its start. Everything in the header is checked before a tensor is handed out:
    N against the file size, JSON syntax, known dtype (BF16, F16, F32; anything else is refused
    with the dtype's name), offsets inside the data section, end - begin == product(shape) *
    dtype size, no overflow. The tensors point into the mapping, which lives as long as the
    object. Model files are external data: every problem is an error string, never an assert.
*/
#ifndef ENG_SAFETENSORS_H
#define ENG_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "eng_ops.h"

#define ENG_ST_MAX_DIMS 8

typedef struct {
    const char *name; /* borrowed from the file object */
    eng_dtype_t dtype;
    int ndim;
    int64_t shape[ENG_ST_MAX_DIMS];
    const void *data; /* into the mapping */
    size_t nbytes;
} eng_st_tensor_t;

typedef struct eng_st_file eng_st_file_t;

/* Maps and validates `path`. Returns NULL with a message in err on any problem. */
eng_st_file_t *eng_st_open(const char *path, char *err, size_t errlen);
/* Validates an in-memory image of a file (the buffer must outlive the object; used by tests
   and by eng_st_open). */
eng_st_file_t *eng_st_parse(const void *buf, size_t len, char *err, size_t errlen);
void eng_st_destroy(eng_st_file_t **self_p);

int eng_st_count(const eng_st_file_t *self);
const eng_st_tensor_t *eng_st_at(const eng_st_file_t *self, int i);
/* Returns the tensor called name, or NULL. */
const eng_st_tensor_t *eng_st_find(const eng_st_file_t *self, const char *name);

#endif
