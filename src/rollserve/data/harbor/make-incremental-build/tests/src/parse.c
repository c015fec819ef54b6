#include <stdlib.h>

#include "parse.h"

size_t read_numbers(FILE *in, double **out)
{
    size_t count = 0, capacity = 16;
    double value;
    double *values = malloc(capacity * sizeof *values);

    if (values == NULL)
        return 0;
    while (fscanf(in, "%lf", &value) == 1) {
        if (count == capacity) {
            double *bigger = realloc(values, 2 * capacity * sizeof *values);
            if (bigger == NULL)
                break;
            values = bigger;
            capacity *= 2;
        }
        values[count++] = value;
    }
    *out = values;
    return count;
}
