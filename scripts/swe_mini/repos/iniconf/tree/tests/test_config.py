import pytest

import iniconf
from iniconf import ConversionError, MissingOptionError

TEXT = """\
[DEFAULT]
root = /srv/app
timeout = 30

[server]
host = 0.0.0.0
port = 8080
debug = yes
ratio = 0.75
log_dir = ${root}/logs

[database]
pool_sizes = 5, 10, 20
timeout = 5
"""


@pytest.fixture
def cfg():
    return iniconf.loads(TEXT)


def test_sections(cfg):
    assert cfg.sections() == ["server", "database"]
    assert "server" in cfg
    assert "DEFAULT" not in cfg.sections()


def test_defaults_are_inherited(cfg):
    assert cfg.get("server", "timeout") == "30"
    assert cfg.get("database", "timeout") == "5"


def test_get_missing_raises(cfg):
    with pytest.raises(MissingOptionError):
        cfg.get("server", "nope")
    with pytest.raises(MissingOptionError):
        cfg.get("nosuch", "host")


def test_get_with_default(cfg):
    assert cfg.get("server", "nope", "fallback") == "fallback"
    assert cfg.get_int("server", "workers", 4) == 4


def test_typed_getters(cfg):
    assert cfg.get_int("server", "port") == 8080
    assert cfg.get_float("server", "ratio") == 0.75
    assert cfg.get_list("database", "pool_sizes") == ["5", "10", "20"]


def test_get_bool_true_values():
    cfg = iniconf.loads("[f]\na = yes\nb = On\nc = TRUE\nd = 1\n")
    assert [cfg.get_bool("f", k) for k in "abcd"] == [True, True, True, True]


def test_get_bool_lowercase_false_values():
    cfg = iniconf.loads("[f]\na = no\nb = off\nc = false\nd = 0\n")
    assert [cfg.get_bool("f", k) for k in "abcd"] == [False, False, False, False]


def test_get_bool_rejects_garbage():
    cfg = iniconf.loads("[f]\na = maybe\n")
    with pytest.raises(ConversionError):
        cfg.get_bool("f", "a")


def test_get_int_rejects_garbage(cfg):
    with pytest.raises(ConversionError):
        cfg.get_int("server", "host")


def test_options_and_items(cfg):
    assert cfg.options("database") == ["pool_sizes", "timeout", "root"]
    assert cfg["database"]["root"] == "/srv/app"


def test_load_from_file(tmp_path):
    path = tmp_path / "app.ini"
    path.write_text("[a]\nx = 1\n", encoding="utf-8")
    cfg = iniconf.load(path)
    assert cfg.get_int("a", "x") == 1
    assert cfg.source == str(path)
