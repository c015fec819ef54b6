"""Reference and wrong solutions of the bundled code tasks (data/code_tasks.jsonl).

Kept with the tests, never shipped to the agent: ``test_code_tasks.py`` proves every
reference passes all hidden tests of its task, and that an empty and a plausible but
wrong solution fail, through the real handler evaluation in a sandbox.
"""

REFERENCE: dict[str, str] = {
    "sum-of-two": """\
a, b = map(int, input().split())
print(a + b)
""",
    "reverse-words": """\
print(" ".join(input().split()[::-1]))
""",
    "fizzbuzz": """\
import sys

n = int(sys.stdin.readline())
out = []
for i in range(1, n + 1):
    if i % 15 == 0:
        out.append("FizzBuzz")
    elif i % 3 == 0:
        out.append("Fizz")
    elif i % 5 == 0:
        out.append("Buzz")
    else:
        out.append(str(i))
print("\\n".join(out))
""",
    "max-subarray": """\
import sys

data = sys.stdin.read().split()
n = int(data[0])
values = list(map(int, data[1:1 + n]))
best = current = values[0]
for x in values[1:]:
    current = max(x, current + x)
    best = max(best, current)
print(best)
""",
    "balanced-brackets": """\
import sys

PAIRS = {")": "(", "]": "[", "}": "{"}
lines = sys.stdin.read().split("\\n")
t = int(lines[0])
for line in lines[1:1 + t]:
    stack = []
    ok = True
    for ch in line.strip():
        if ch in "([{":
            stack.append(ch)
        elif not stack or stack.pop() != PAIRS[ch]:
            ok = False
            break
    print("YES" if ok and not stack else "NO")
""",
    "count-primes": """\
n = int(input())
if n < 2:
    print(0)
else:
    sieve = bytearray([1]) * (n + 1)
    sieve[0] = sieve[1] = 0
    for i in range(2, int(n ** 0.5) + 1):
        if sieve[i]:
            sieve[i * i::i] = bytearray(len(range(i * i, n + 1, i)))
    print(sum(sieve))
""",
    "is-palindrome": """\
def is_palindrome(s: str) -> bool:
    kept = [c.lower() for c in s if c.isalnum()]
    return kept == kept[::-1]
""",
    "two-sum": """\
def two_sum(nums: list[int], target: int) -> list[int]:
    seen = {}
    for j, x in enumerate(nums):
        if target - x in seen:
            return [seen[target - x], j]
        seen[x] = j
    return []
""",
    "roman-to-int": """\
VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def roman_to_int(s: str) -> int:
    total = 0
    for i, ch in enumerate(s):
        value = VALUES[ch]
        if i + 1 < len(s) and VALUES[s[i + 1]] > value:
            total -= value
        else:
            total += value
    return total
""",
    "merge-intervals": """\
def merge_intervals(intervals: list[list[int]]) -> list[list[int]]:
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged
""",
    "lcs-length": """\
def lcs_length(a: str, b: str) -> int:
    previous = [0] * (len(b) + 1)
    for ch in a:
        current = [0]
        for j, other in enumerate(b):
            current.append(previous[j] + 1 if ch == other else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]
""",
    "top-k-words": """\
import re
from collections import Counter


def top_k_words(text: str, k: int) -> list[str]:
    counts = Counter(re.findall(r"[a-z]+", text.lower()))
    return sorted(counts, key=lambda w: (-counts[w], w))[:k]
""",
}

# Plausible mistakes: each fails at least one hidden test (most pass some).
WRONG: dict[str, str] = {
    "sum-of-two": "print(sum(map(float, input().split())))\n",  # 3.0, and float precision
    "reverse-words": "print(input()[::-1])\n",  # reverses the characters
    "fizzbuzz": """\
n = int(input())
for i in range(1, n + 1):
    print("Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0 else "FizzBuzz" if i % 15 == 0 else i)
""",
    "max-subarray": """\
import sys

data = sys.stdin.read().split()
best = current = 0
for x in map(int, data[1:]):
    current = max(0, current + x)
    best = max(best, current)
print(best)
""",  # 0 when every number is negative
    "balanced-brackets": """\
import sys

lines = sys.stdin.read().split("\\n")
for line in lines[1:1 + int(lines[0])]:
    ok = all(line.count(a) == line.count(b) for a, b in ("()", "[]", "{}"))
    print("YES" if ok else "NO")
""",  # ([)] passes the count
    "count-primes": """\
n = int(input())
print(sum(1 for k in range(1, n + 1) if all(k % d for d in range(2, int(k ** 0.5) + 1))))
""",  # counts 1 as a prime (and is slow)
    "is-palindrome": "def is_palindrome(s):\n    return s == s[::-1]\n",
    "two-sum": """\
def two_sum(nums, target):
    for i, x in enumerate(nums):
        if target - x in nums:
            return [i, nums.index(target - x)]
""",  # [0, 0] for [3, 3], and quadratic
    "roman-to-int": """\
def roman_to_int(s):
    values = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
    return sum(values[c] for c in s)
""",
    "merge-intervals": """\
def merge_intervals(intervals):
    merged = []
    for start, end in intervals:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged
""",  # never sorts
    "lcs-length": """\
from collections import Counter


def lcs_length(a, b):
    return sum((Counter(a) & Counter(b)).values())
""",  # common letters, not a subsequence
    "top-k-words": """\
import re
from collections import Counter


def top_k_words(text, k):
    return [w for w, _ in Counter(re.findall(r"[a-z]+", text.lower())).most_common(k)]
""",  # ties in order of first appearance
}
