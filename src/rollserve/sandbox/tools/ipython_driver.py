"""The in-sandbox half of the IPython tool: a kernel spoken to in JSON lines on stdio.

Runs INSIDE the sandbox, with the sandbox's python, which needs IPython (and, for
plots, matplotlib). It imports nothing from rollserve: the host starts it as
``python -u -c <this file's source> <tag> <max_output_bytes>``, so no file has to be
copied into the sandbox on any runtime.

Wire (one JSON object per line):
- host -> driver (stdin): ``{"op": "run", "id": n, "code": "..."}`` and
  ``{"op": "interrupt", "id": n}``.
- driver -> host (stdout): ``<tag>{...}`` lines: ``{"ready": true}`` once, then one
  response per run. Lines without the tag (a warning on the driver's own stderr,
  which a runtime may merge into stdout) are not part of the protocol.

What a cell prints never reaches that channel: file descriptors 1 and 2 point at two
unlinked files for the life of the kernel (so a subprocess or C library writing to
fd 1 is captured too, and in order), fd 0 is /dev/null (``input()`` cannot eat the
protocol), and the protocol uses private duplicates of the original fds.

Interrupts: a reader thread takes requests off stdin; ``interrupt`` sends SIGINT to
this process while the named cell runs (the thread blocks SIGINT, so the main thread
gets it: a blocking sleep wakes, and the cell sees KeyboardInterrupt). This works on
every runtime, even where the host cannot signal inside the sandbox.
"""

import base64
import fcntl
import json
import os
import queue
import signal
import sys
import tempfile
import threading


def _capture_fd(target):
    """Point ``target`` (1 or 2) at a fresh unlinked file; return that file's fd."""
    fd, path = tempfile.mkstemp(prefix="rollserve-ipython-")
    os.unlink(path)
    # O_APPEND: after a truncate, every writer (fd 1, a subprocess's copy of it)
    # writes at the new end, whatever offset it had.
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
    os.dup2(fd, target)
    return fd


def _read_capped(fd, limit):
    """(text, dropped bytes) of a capture file: head and tail if over ``limit``."""
    size = os.fstat(fd).st_size
    if size <= limit:
        data = os.pread(fd, size, 0)
        dropped = 0
    else:
        half = limit // 2
        head = os.pread(fd, half, 0)
        tail = os.pread(fd, limit - half, size - (limit - half))
        dropped = size - limit
        data = head + f"\n[... {dropped} bytes of output dropped (head and tail kept) ...]\n".encode() + tail
    os.ftruncate(fd, 0)
    return data.decode("utf-8", "replace"), dropped


def main():
    tag = sys.argv[1]
    max_output = int(sys.argv[2])
    max_images = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    _private_state()
    # Imported before stderr is redirected: a missing IPython is reported to the host.
    ipython = _import_ipython()

    # Private protocol channel first, then point the standard fds elsewhere.
    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    out_fd = _capture_fd(1)
    err_fd = _capture_fd(2)
    sys.stdin = open(os.devnull)
    sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)

    def send(message):
        data = (tag + json.dumps(message) + "\n").encode()
        # A late interrupt must not cut a response in half: hold SIGINT while writing.
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(proto_out, view) :]
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    captured = {"result": None, "display": [], "error": None}
    shell = _shell(ipython, captured)
    requests = queue.Queue()
    running = {"id": None}
    threading.Thread(target=_reader, args=(proto_in, requests, running), daemon=True).start()
    os.ftruncate(out_fd, 0)  # start-up noise (warnings) is nobody's cell output
    os.ftruncate(err_fd, 0)
    send({"ready": True, "python": sys.version.split()[0], "pid": os.getpid()})

    while True:
        try:
            request = requests.get()
        except KeyboardInterrupt:  # an interrupt that arrived just after its cell ended
            continue
        if request is None:
            return
        captured.update(result=None, display=[], error=None, error_name=None)
        ok, count, interrupted = _run_cell(shell, request, running)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            stdout, out_dropped = _read_capped(out_fd, max_output)
            stderr, err_dropped = _read_capped(err_fd, max_output)
            result, images, texts = _displayed(captured)
            send(
                {
                    "id": request.get("id"),
                    "count": count,
                    "ok": ok and captured["error"] is None,
                    "stdout": stdout,
                    "stderr": stderr,
                    "dropped": out_dropped + err_dropped,
                    "result": result,
                    "display": texts,
                    "images": images[:max_images],
                    "images_dropped": max(0, len(images) - max_images),
                    "error": captured["error"] or ("KeyboardInterrupt" if interrupted else None),
                    "error_name": captured["error_name"] or ("KeyboardInterrupt" if interrupted else None),
                }
            )
        except KeyboardInterrupt:
            continue


def _private_state():
    """IPython and matplotlib keep state under $HOME, which an image may point at the
    workspace (the runtimes set it to the private /tmp): keep it in the sandbox's
    private temp folder so the agent's files (and a task's git diff) stay clean. No
    history database either."""
    state = os.path.join(tempfile.gettempdir(), "rollserve-ipython")
    os.environ.setdefault("IPYTHONDIR", os.path.join(state, "ipython"))
    os.environ.setdefault("MPLCONFIGDIR", os.path.join(state, "matplotlib"))
    os.makedirs(os.environ["IPYTHONDIR"], exist_ok=True)


def _import_ipython():
    """IPython's display hook, display publisher and shell classes, and traitlets' Config."""
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    return DisplayHook, DisplayPublisher, InteractiveShell, Config


def _shell(ipython, captured):
    """An IPython shell (no history) whose results, displays and tracebacks go to
    ``captured`` instead of being printed."""
    DisplayHook, DisplayPublisher, InteractiveShell, Config = ipython

    class Hook(DisplayHook):
        def write_output_prompt(self):
            pass

        def write_format_data(self, format_dict, md_dict=None):
            captured["result"] = format_dict

        def finish_displayhook(self):
            self._is_active = False

    class Publisher(DisplayPublisher):
        def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kw):
            captured["display"].append(data)

        def clear_output(self, wait=False):
            captured["display"].clear()

    class Shell(InteractiveShell):
        displayhook_class = Hook
        display_pub_class = Publisher

        def _showtraceback(self, etype, evalue, stb):
            captured["error"] = self.InteractiveTB.stb2text(stb)
            captured["error_name"] = getattr(etype, "__name__", str(etype))

    config = Config()
    config.HistoryManager.enabled = False
    return Shell.instance(config=config, colors="nocolor")


def _reader(proto_in, requests, running):
    """The reader thread: runs go to ``requests``; an interrupt of the running cell is a
    SIGINT to this process (the main thread gets it: this thread blocks it)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    for line in proto_in:
        try:
            request = json.loads(line)
        except ValueError:
            continue
        if request.get("op") == "interrupt":
            if running["id"] is not None and running["id"] == request.get("id"):
                os.kill(os.getpid(), signal.SIGINT)
        else:
            requests.put(request)
    requests.put(None)  # stdin closed: the host is gone


def _run_cell(shell, request, running):
    """(whether the cell ran to success, its execution count, whether an interrupt
    landed outside the user's code, in IPython itself)."""
    running["id"] = request.get("id")
    try:
        outcome = shell.run_cell(request.get("code", ""), store_history=True)
        return outcome.success, shell.execution_count - 1, False
    except KeyboardInterrupt:  # landed outside the user's code (in IPython itself)
        return False, shell.execution_count, True
    finally:
        running["id"] = None


def _displayed(captured):
    """(the cell's result as text, the images of it and of its displays, the displays'
    texts where they have no image)."""
    result, images, texts = None, [], []
    if captured["result"] is not None:
        result = captured["result"].get("text/plain")
        images += _pngs(captured["result"])
    for data in captured["display"]:
        found = _pngs(data)
        images += found
        if not found and "text/plain" in data:
            texts.append(data["text/plain"])
    return result, images, texts


def _pngs(data):
    png = data.get("image/png")
    if png is None:
        return []
    if isinstance(png, (bytes, bytearray)):
        png = base64.b64encode(png).decode()
    return [png]


if __name__ == "__main__":
    main()
