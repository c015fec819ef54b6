#ifndef STATS_H
#define STATS_H

#include <stddef.h>

struct stats {
    size_t count;
    double min, max, mean;
};

/* Fills `s` from the `n` values at `xs` (min, max and mean are 0 when n is 0). */
void compute_stats(const double *xs, size_t n, struct stats *s);

#endif
