#ifndef PARSE_H
#define PARSE_H

#include <stddef.h>
#include <stdio.h>

/* Reads whitespace-separated numbers from `in` into a new array (*out, to free).
   Returns how many were read; stops at the first word that is not a number. */
size_t read_numbers(FILE *in, double **out);

#endif
