import subprocess

for line in open("/tests/cases.txt"):
    _, *args, _, want = line.split()
    got = subprocess.run(["python3", "/workspace/total.py", *args], capture_output=True,
                         text=True).stdout.strip()
    print("ok" if got == want else f"bad {args}: {got!r} != {want!r}")
