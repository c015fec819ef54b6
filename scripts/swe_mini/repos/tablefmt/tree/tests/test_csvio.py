import io

import pytest

from tablefmt import read_csv, read_csv_file, write_csv


def test_read_csv_converts_values():
    t = read_csv("name,qty,price\napple,3,0.5\npear,,1\n")
    assert t.headers == ["name", "qty", "price"]
    assert t.rows == [["apple", 3, 0.5], ["pear", None, 1]]


def test_read_csv_without_conversion():
    t = read_csv("a,b\n1,\n", convert=False)
    assert t.rows == [["1", ""]]


def test_read_csv_quoted_fields_and_blank_lines():
    t = read_csv('name,note\n\n"Smith, J.","said ""hi"""\n')
    assert t.rows == [["Smith, J.", 'said "hi"']]


def test_read_csv_pads_short_rows_and_rejects_long_ones():
    assert read_csv("a,b\n1\n").rows == [[1, None]]
    with pytest.raises(ValueError, match="row 2"):
        read_csv("a,b\n1,2,3\n")


def test_read_csv_from_file_object_and_delimiter():
    t = read_csv(io.StringIO("a;b\nx;y\n"), delimiter=";")
    assert t.column("b") == ["y"]


def test_read_csv_file(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("city,pop\nOslo,709037\n", encoding="utf-8")
    assert read_csv_file(path).column("pop") == [709037]


def test_empty_input():
    with pytest.raises(ValueError):
        read_csv("")


def test_write_csv_round_trip():
    t = read_csv("a,b\n1,x y\n,\"q,r\"\n")
    assert write_csv(t) == 'a,b\n1,x y\n,"q,r"\n'
