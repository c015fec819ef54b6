import pytest

import iniconf
from iniconf import InterpolationError


def test_same_section_reference():
    cfg = iniconf.loads("[a]\nname = web\nlabel = ${name}-1\n")
    assert cfg.get("a", "label") == "web-1"


def test_default_section_reference():
    cfg = iniconf.loads("[DEFAULT]\nroot = /srv\n[a]\nlogs = ${root}/logs\n")
    assert cfg.get("a", "logs") == "/srv/logs"


def test_cross_section_reference():
    cfg = iniconf.loads("[db]\nhost = db1\n[app]\nurl = pg://${db:host}/main\n")
    assert cfg.get("app", "url") == "pg://db1/main"


def test_nested_references():
    cfg = iniconf.loads("[a]\nx = 1\ny = ${x}${x}\nz = ${y}-${y}\n")
    assert cfg.get("a", "z") == "11-11"


def test_dollar_escape():
    cfg = iniconf.loads("[a]\nprice = $$5\nliteral = $${x}\n")
    assert cfg.get("a", "price") == "$5"
    assert cfg.get("a", "literal") == "${x}"


def test_raw_get_skips_interpolation():
    cfg = iniconf.loads("[a]\nx = ${y}\n")
    assert cfg.get("a", "x", raw=True) == "${y}"


def test_missing_reference():
    cfg = iniconf.loads("[a]\nx = ${nope}\n")
    with pytest.raises(InterpolationError, match="nope"):
        cfg.get("a", "x")
