#include <stdio.h>
#include <stdlib.h>

#include "parse.h"
#include "stats.h"

int main(void)
{
    double *values = NULL;
    size_t n = read_numbers(stdin, &values);
    struct stats s;

    compute_stats(values, n, &s);
    printf("count=%zu\n", s.count);
    if (s.count > 0)
        printf("min=%.3f\nmax=%.3f\nmean=%.3f\n", s.min, s.max, s.mean);
    free(values);
    return 0;
}
