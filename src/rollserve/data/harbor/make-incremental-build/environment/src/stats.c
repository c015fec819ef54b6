#include "stats.h"

void compute_stats(const double *xs, size_t n, struct stats *s)
{
    double total = 0.0;

    s->count = n;
    s->min = s->max = s->mean = 0.0;
    if (n == 0)
        return;
    s->min = s->max = xs[0];
    for (size_t i = 0; i < n; i++) {
        if (xs[i] < s->min)
            s->min = xs[i];
        if (xs[i] > s->max)
            s->max = xs[i];
        total += xs[i];
    }
    s->mean = total / (double)n;
}
