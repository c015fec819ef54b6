"""Tools that act inside a sandbox: a bash shell on a PTY, an IPython kernel on
pipes, and a file editor on the workspace. Each works on any runtime."""
