#!/bin/bash
set -e
wc -w < "$WORDS_FILE" | tr -d ' ' > /app/count.txt
