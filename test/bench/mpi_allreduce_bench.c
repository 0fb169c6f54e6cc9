/* mpi_allreduce_bench: Open MPI's MPI_Allreduce measured the way
 * allreduce_bench measures ours (float32 sum, in place, nccl-tests columns),
 * so that both can run in the same session on the same machine:
 *
 *   mpirun --allow-run-as-root -np 2 mpi_allreduce_bench -b 4K -e 256M -f 4 -n 10 -w 3
 *
 * Built only when an MPI implementation is found; not a dependency. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long long parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0)
        return -1;
    if (*end == 'K' || *end == 'k')
        v *= 1024, end++;
    else if (*end == 'M' || *end == 'm')
        v *= 1024 * 1024, end++;
    else if (*end == 'G' || *end == 'g')
        v *= 1024.0 * 1024 * 1024, end++;
    return *end ? -1 : (long long)v;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    long long minb = 4096, maxb = 256ll << 20, factor = 4, iters = 10, warmup = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        long long v = parse_size(argv[i + 1]);
        if (strcmp(argv[i], "-b") == 0)
            minb = v;
        else if (strcmp(argv[i], "-e") == 0)
            maxb = v;
        else if (strcmp(argv[i], "-f") == 0)
            factor = v;
        else if (strcmp(argv[i], "-n") == 0)
            iters = v;
        else if (strcmp(argv[i], "-w") == 0)
            warmup = v;
    }
    if (minb < 4 || maxb < minb || factor < 2 || iters < 1 || warmup < 0) {
        if (rank == 0)
            fprintf(stderr, "usage: mpi_allreduce_bench [-b MIN] [-e MAX] [-f F] [-n N] [-w W]\n");
        MPI_Finalize();
        return 2;
    }
    float *buf = malloc((size_t)maxb);
    for (long long i = 0; i < maxb / 4; i++)
        buf[i] = (float)(i % 7);
    if (rank == 0) {
        printf("# mpi_allreduce_bench: %d ranks, MPI_Allreduce float sum, in place\n", n);
        printf("%12s %12s %8s %12s %10s %10s\n", "size_bytes", "count", "dtype", "time_us",
               "algbw_gbs", "busbw_gbs");
    }
    for (long long bytes = minb; bytes <= maxb; bytes *= factor) {
        int count = (int)(bytes / 4);
        for (int i = 0; i < warmup; i++)
            MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++)
            MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double us = (MPI_Wtime() - t0) / (double)iters * 1e6;
        double algbw = (double)bytes / us / 1e3;
        if (rank == 0)
            printf("%12lld %12d %8s %12.1f %10.3f %10.3f\n", bytes, count, "float", us, algbw,
                   algbw * 2.0 * (n - 1) / n);
    }
    free(buf);
    MPI_Finalize();
    return 0;
}
