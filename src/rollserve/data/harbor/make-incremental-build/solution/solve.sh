#!/bin/bash
# Reference solution: pattern rules into build/, header dependencies from the compiler
# (-MMD writes build/NAME.d, included back), order-only prerequisites for the folders.
set -euo pipefail
cat > Makefile <<'MAKE'
CC ?= cc
CFLAGS = -O2 -Wall
SOURCES := $(wildcard src/*.c)
OBJECTS := $(patsubst src/%.c,build/%.o,$(SOURCES))

all: bin/stats

bin/stats: $(OBJECTS) | bin
	$(CC) $(CFLAGS) -o $@ $(OBJECTS)

build/%.o: src/%.c | build
	$(CC) $(CFLAGS) -MMD -MP -c -o $@ $<

build bin:
	mkdir -p $@

clean:
	rm -rf build bin

-include $(OBJECTS:.o=.d)

.PHONY: all clean
MAKE
make
