"""The file editor: every command, and every way a path could leave the workspace."""

from __future__ import annotations

import os

import pytest

from rollserve.sandbox.tools.editor import EditorConfig, EditorError, FileEditor


@pytest.fixture
def workspace(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "main.py").write_text("def add(a, b):\n    return a + b\n\n\nprint(add(1, 2))\n")
    return ws


@pytest.fixture
def editor(workspace):
    return FileEditor(workspace)


# --- view ------------------------------------------------------------------------------
def test_view_numbers_lines(editor):
    out = editor.view("/workspace/main.py")
    assert out.startswith("/workspace/main.py (5 lines):")
    assert "     1\tdef add(a, b):" in out and "     5\tprint(add(1, 2))" in out


def test_view_range_and_to_the_end(editor):
    out = editor.view("main.py", [2, 3])
    assert "lines 2-3 of 5" in out and "     2\t    return a + b" in out
    assert "def add" not in out
    assert "     5\tprint" in editor.view("main.py", [4, -1])


@pytest.mark.parametrize("bad", [[0, 2], [3, 2], [1, 99], [1], "1-2", [1.5, 2]])
def test_view_range_errors_say_what_is_valid(editor, bad):
    with pytest.raises(EditorError, match="view_range"):
        editor.view("main.py", bad)


def test_view_folder_lists_two_levels_without_hidden(editor, workspace):
    (workspace / "pkg" / "sub" / "deeper").mkdir(parents=True)
    (workspace / "pkg" / "sub" / "deeper" / "x.py").write_text("")
    (workspace / ".git").mkdir()
    out = editor.view("/workspace")
    assert "/workspace/main.py" in out and "/workspace/pkg/" in out and "/workspace/pkg/sub/" in out
    assert ".git" not in out and "deeper" not in out


def test_view_missing_binary_and_huge_files(editor, workspace):
    with pytest.raises(EditorError, match="does not exist"):
        editor.view("nope.py")
    (workspace / "blob.bin").write_bytes(b"\x00\x01\x02" * 10)
    with pytest.raises(EditorError, match="binary"):
        editor.view("blob.bin")
    small = FileEditor(workspace, EditorConfig(max_file_bytes=10))
    with pytest.raises(EditorError, match="over the editor's limit"):
        small.view("main.py")


def test_view_refuses_a_fifo_instead_of_blocking(editor, workspace):
    os.mkfifo(workspace / "pipe")
    with pytest.raises(EditorError, match="not a regular file"):
        editor.view("pipe")


def test_long_views_keep_head_and_tail(workspace):
    (workspace / "big.txt").write_text("".join(f"line {i}\n" for i in range(5000)))
    out = FileEditor(workspace, EditorConfig(max_view_chars=2000)).view("big.txt")
    assert "line 0" in out and "line 4999" in out and "characters of output dropped" in out


# --- create ------------------------------------------------------------------------------
def test_create_makes_folders_and_refuses_to_overwrite(editor, workspace):
    assert "Created /workspace/a/b/new.txt" in editor.create("/workspace/a/b/new.txt", "hi\n")
    assert (workspace / "a" / "b" / "new.txt").read_text() == "hi\n"
    with pytest.raises(EditorError, match="already exists"):
        editor.create("a/b/new.txt", "again")
    with pytest.raises(EditorError, match="is a folder"):
        editor.create("a", "x")


# --- str_replace ---------------------------------------------------------------------------
def test_str_replace_unique_match(editor, workspace):
    out = editor.str_replace("main.py", "return a + b", "return a - b")
    assert "Edited /workspace/main.py" in out and "     2\t    return a - b" in out
    assert "return a - b" in (workspace / "main.py").read_text()


def test_str_replace_zero_matches_points_at_whitespace(editor, workspace):
    before = (workspace / "main.py").read_text()
    with pytest.raises(EditorError, match="not found verbatim") as error:
        editor.str_replace("main.py", "return  a + b", "x")
    with pytest.raises(EditorError, match="line\\(s\\) 2") as error:
        editor.str_replace("main.py", "\treturn a + b", "x")  # a tab, not spaces
    assert "whitespace" in str(error.value)
    assert (workspace / "main.py").read_text() == before


def test_str_replace_multiple_matches_says_where(editor, workspace):
    (workspace / "dup.py").write_text("x = 1\ny = 2\nx = 1\n")
    with pytest.raises(EditorError, match="occurs 2 times .*lines 1, 3"):
        editor.str_replace("dup.py", "x = 1", "x = 3")
    assert (workspace / "dup.py").read_text() == "x = 1\ny = 2\nx = 1\n"


def test_str_replace_rejects_empty_and_identical(editor):
    with pytest.raises(EditorError, match="must not be empty"):
        editor.str_replace("main.py", "", "x")
    with pytest.raises(EditorError, match="the same"):
        editor.str_replace("main.py", "add", "add")


# --- insert -------------------------------------------------------------------------------------
def test_insert_at_top_middle_and_end(editor, workspace):
    editor.insert("main.py", 0, "# header")
    editor.insert("main.py", 3, "    # after return")
    editor.insert("main.py", 7, "print('end')\n")
    assert (workspace / "main.py").read_text().splitlines() == [
        "# header",
        "def add(a, b):",
        "    return a + b",
        "    # after return",
        "",
        "",
        "print(add(1, 2))",
        "print('end')",
    ]


def test_insert_after_a_last_line_without_newline(editor, workspace):
    (workspace / "n.txt").write_text("a\nb")
    editor.insert("n.txt", 2, "c")
    assert (workspace / "n.txt").read_text() == "a\nb\nc\n"


def test_insert_line_out_of_range(editor):
    with pytest.raises(EditorError, match="out of range: /workspace/main.py has 5 lines"):
        editor.insert("main.py", 6, "x")
    with pytest.raises(EditorError, match="integer"):
        editor.insert("main.py", "2", "x")


# --- undo ---------------------------------------------------------------------------------------
def test_undo_walks_back_per_file(editor, workspace):
    original = (workspace / "main.py").read_text()
    editor.str_replace("main.py", "a + b", "a * b")
    editor.insert("main.py", 0, "# top")
    editor.create("other.py", "x = 1\n")
    assert "Undid the last edit" in editor.undo("main.py")
    assert "a * b" in (workspace / "main.py").read_text()
    editor.undo("main.py")
    assert (workspace / "main.py").read_text() == original
    with pytest.raises(EditorError, match="no edit"):
        editor.undo("main.py")
    assert "file removed" in editor.undo("other.py")
    assert not (workspace / "other.py").exists()


def test_undo_history_is_bounded(workspace):
    editor = FileEditor(workspace, EditorConfig(history_depth=2))
    for i in range(4):
        editor.insert("main.py", 0, f"# {i}")
    editor.undo("main.py")
    editor.undo("main.py")
    with pytest.raises(EditorError, match="no edit"):
        editor.undo("main.py")


# --- confinement: every way out is refused ----------------------------------------------------
@pytest.mark.parametrize(
    "path",
    [
        "../outside.txt",
        "/workspace/../etc/passwd",
        "a/../../x",
        "/workspace/a/../../x",
        "..",
    ],
)
def test_dotdot_is_refused(editor, path):
    with pytest.raises(EditorError, match="'\\.\\.' is not allowed"):
        editor.view(path)


@pytest.mark.parametrize("path", ["/etc/passwd", "/tmp/x", "/workspacefoo/x", "/", "/work"])
def test_absolute_paths_outside_the_workspace_are_refused(editor, path):
    with pytest.raises(EditorError, match="only paths inside /workspace"):
        editor.create(path, "x")


def test_symlink_to_a_file_outside_is_refused(editor, workspace, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    os.symlink(secret, workspace / "link.txt")
    for call in (
        lambda: editor.view("link.txt"),
        lambda: editor.str_replace("link.txt", "top", "no"),
        lambda: editor.insert("link.txt", 0, "x"),
    ):
        with pytest.raises(EditorError, match="symlink"):
            call()
    assert secret.read_text() == "top secret"


def test_symlinked_folder_and_dangling_link_outside_are_refused(editor, workspace, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, workspace / "escape")
    with pytest.raises(EditorError, match="symlink"):
        editor.create("escape/new.txt", "x")
    os.symlink(tmp_path / "not-yet", workspace / "dangling")
    with pytest.raises(EditorError, match="symlink"):
        editor.create("dangling", "x")
    assert list(outside.iterdir()) == [] and not (tmp_path / "not-yet").exists()


def test_symlink_inside_the_workspace_is_fine(editor, workspace):
    os.symlink(workspace / "main.py", workspace / "alias.py")
    assert "def add" in editor.view("alias.py")


def test_new_files_belong_to_the_workspace_owner(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("only a root server writes files another uid must own")
    ws = tmp_path / "owned"
    ws.mkdir()
    os.chown(ws, 65534, 65534)
    FileEditor(ws).create("d/new.txt", "x")
    assert (ws / "d").stat().st_uid == 65534 and (ws / "d" / "new.txt").stat().st_uid == 65534


async def test_the_sandbox_can_change_what_the_editor_created(sandbox):
    """Host-side edits must stay editable inside (bubblewrap as root runs as nobody)."""
    from rollserve.sandbox.tools.bash import BashSession

    editor = FileEditor(sandbox.workspace)
    editor.create("/workspace/pkg/mod.py", "x = 1\n")
    async with BashSession(sandbox) as shell:
        result = await shell.run("echo 'y = 2' >> pkg/mod.py && touch pkg/other.py && cat pkg/mod.py")
    assert result.exit_code == 0 and result.output == "x = 1\ny = 2\n"
    assert "     2\ty = 2" in editor.view("pkg/mod.py")
