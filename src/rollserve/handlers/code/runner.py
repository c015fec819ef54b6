"""The assert runner: this file's source runs INSIDE the test sandbox, as
``python3 -c <source>``, once per assert test. Standard library only, Python 3.6+.

It never decides whether a test passed. It reads one JSON line from stdin::

    {"module": "solution", "setup": "<code>", "probes": ["<expr>", ...], "max_bytes": N}

imports the solution module, runs the setup code, evaluates each probe (an operand
of the assert that needs the solution, e.g. ``two_sum([3, 3], 6)``) and writes ONE
JSON document to its stdout::

    {"probes": [{"value": V} | {"error": "Type: message"} | {"not_plain": "TypeName"}
                | {"too_large": "why"}, ...]}

The server compares the decoded values with the expected ones, which never enter the
sandbox (``code.asserts``). V is a strict encoding of exact builtin values only
(``type(x) is int`` etc., recursively; bounded depth and size): ``null``, ``true``,
``false``, a JSON string, a JSON integer (|x| < 2**63), ``{"int": "<hex>"}``, a float
(``1.5``, ``Infinity``, ``NaN``), a JSON array for a list, ``{"tuple"|"set"|"frozenset":
[...]}``, ``{"dict": [[k, v], ...]}``, ``{"bytes": "<hex>"}``. Anything else (a subclass
of int, an object that equals everything) is reported as not a plain value.

With ``"module": null`` it is the *reference* run (``code.hidden_tests``): the
solution is not imported (the workspace is taken off ``sys.path`` first), and when the
setup code raises, every probe reports that error.

The functions it relies on are taken before the solution is imported, and the
solution's own prints go to stderr (fd 1 is pointed at fd 2 before the import; the
report goes to a copy of the original stdout). None of this is a security boundary:
the solution shares this process and can write anything anywhere. What holds is
that nothing here is secret (no nonce, no expected value): a solution that forges
the report can only claim values for the probes, which is what computing them does.
"""


def _main():  # noqa: C901 - one closure over the builtins taken before the solution loads; reviewed line by line
    import json
    import os
    import sys
    from json import encoder

    # Taken before the solution can replace them.
    type_, str_, len_, hex_, bytes_hex = type, str, len, hex, bytes.hex
    int_repr, float_repr, dict_items = int.__repr__, float.__repr__, dict.items
    type_name = type.__dict__["__name__"].__get__
    quote = encoder.encode_basestring_ascii
    join, write, exit_now = "".join, os.write, os._exit
    base_exception, recursion_error = BaseException, RecursionError
    compile_, eval_, exec_, vars_, import_ = compile, eval, exec, vars, __import__
    inf = float("inf")
    big = 1 << 63
    max_depth = 100

    payload = json.loads(sys.stdin.readline())
    sys.stdin = open(os.devnull)
    max_bytes = int(payload.get("max_bytes", 1 << 20))
    report_fd = os.dup(1)  # the report's channel; the solution's prints go to stderr
    os.dup2(2, 1)

    class NotPlain(Exception):
        pass

    class TooLarge(Exception):
        pass

    def name_of(cls):
        try:
            name = type_name(cls)
            return name[:80] if type_(name) is str_ else "?"
        except base_exception:
            return "?"

    def encode(value, parts, size, depth):  # noqa: C901 - one branch per plain type, as the encoding lists them
        """Append the encoding of ``value`` to ``parts``; return the size so far."""
        if depth > max_depth:
            raise NotPlain("nested more than %d deep" % max_depth)
        kind = type_(value)
        if value is None:
            text = "null"
        elif kind is bool:
            text = "true" if value is True else "false"
        elif kind is int:
            text = int_repr(value) if -big < value < big else '{"int":"%s"}' % hex_(value)
        elif kind is float:
            if value != value:
                text = "NaN"
            elif value == inf or value == -inf:
                text = "Infinity" if value > 0 else "-Infinity"
            else:
                text = float_repr(value)
        elif kind is str:
            text = quote(value)
        elif kind is bytes:
            text = '{"bytes":"%s"}' % bytes_hex(value)
        elif kind is list or kind is tuple or kind is set or kind is frozenset:
            parts.append("[" if kind is list else '{"%s":[' % type_name(kind))
            first = True
            for item in value:
                if not first:
                    parts.append(",")
                first = False
                size = encode(item, parts, size + 1, depth + 1)
            text = "]" if kind is list else "]}"
        elif kind is dict:
            parts.append('{"dict":[')
            first = True
            for key, item in dict_items(value):
                parts.append("[" if first else ",[")
                first = False
                size = encode(key, parts, size + 2, depth + 1)
                parts.append(",")
                size = encode(item, parts, size + 2, depth + 1)
                parts.append("]")
            text = "]}"
        else:
            raise NotPlain("type " + name_of(kind))
        parts.append(text)
        size = size + len_(text)
        if size > max_bytes:
            raise TooLarge("more than %d bytes" % max_bytes)
        return size

    def error_entry(exc):
        try:
            message = str_(exc)[:300]
        except base_exception:
            message = "?"
        return '{"error":%s}' % quote(name_of(type_(exc)) + (": " + message if message else ""))

    namespace = {"__name__": "__rollserve_test__", "__builtins__": __builtins__}
    setup_error = None
    if payload["module"] is None:  # the reference run: no solution, nothing of the workspace
        sys.path[:] = [p for p in sys.path if p not in ("", ".", os.getcwd())]
        try:
            exec_(compile_(payload["setup"], "<setup>", "exec"), namespace)
        except base_exception as exc:
            setup_error = error_entry(exc)
    else:
        module = import_(payload["module"])
        namespace.update({k: v for k, v in vars_(module).items() if not k.startswith("__")})
        exec_(compile_(payload["setup"], "<setup>", "exec"), namespace)

    entries = []
    used = 0
    for source in payload["probes"]:
        if setup_error is not None:
            entries.append(setup_error)
            continue
        try:
            value = eval_(compile_(source, "<test>", "eval"), namespace)
        except base_exception as exc:
            entries.append(error_entry(exc))
            continue
        parts = []
        try:
            used = encode(value, parts, used, 0)
            entries.append('{"value":%s}' % join(parts))
        except NotPlain as why:
            entries.append('{"not_plain":%s}' % quote(why.args[0]))
        except TooLarge as why:
            entries.append('{"too_large":%s}' % quote(why.args[0]))
        except recursion_error:
            entries.append('{"not_plain":"too deeply nested"}')
    data = ('{"probes":[%s]}\n' % ",".join(entries)).encode("ascii")
    while data:
        data = data[write(report_fd, data) :]
    exit_now(0)  # nothing the solution registered (atexit, threads) runs after the report


if __name__ == "__main__":
    _main()
