/*  fuzz_replay.c - runs a fuzz target over files, for compilers without libFuzzer.

    `fuzz_replay_<target> FILE|DIR...` feeds each file (each file of each directory) to
    LLVMFuzzerTestOneInput once. A crash or abort fails the test; otherwise it prints the number
    of inputs run. Used by ctest (label fuzz) to keep every corpus entry and every crash found
    as a regression test.
*/
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int s_run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open '%s'\n", path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    size_t got = n > 0 ? fread(buf, 1, (size_t)n, f) : 0;
    fclose(f);
    LLVMFuzzerTestOneInput(buf, got);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    int ran = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "cannot stat '%s'\n", argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            if (s_run_file(argv[i]) != 0)
                return 1;
            ran++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (e->d_name[0] == '.')
                continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            if (s_run_file(path) != 0)
                return 1;
            ran++;
        }
        if (d)
            closedir(d);
    }
    printf("replayed %d inputs\n", ran);
    return ran > 0 ? 0 : 1;
}
