import pytest

from tablefmt import Table


def test_from_dicts_collects_columns():
    t = Table.from_dicts([{"a": 1}, {"b": 2, "a": 3}])
    assert t.headers == ["a", "b"]
    assert t.rows == [[1, None], [3, 2]]


def test_from_dicts_explicit_columns():
    t = Table.from_dicts([{"a": 1, "b": 2}], columns=["b"])
    assert t.rows == [[2]]


def test_add_row_checks_length():
    t = Table(["a", "b"])
    with pytest.raises(ValueError):
        t.add_row([1])


def test_duplicate_headers_rejected():
    with pytest.raises(ValueError):
        Table(["a", "a"])


def test_column_and_missing_column():
    t = Table(["a", "b"], [[1, 2], [3, 4]])
    assert t.column("b") == [2, 4]
    with pytest.raises(KeyError):
        t.column("c")


def test_select():
    t = Table(["a", "b", "c"], [[1, 2, 3]])
    assert t.select("c", "a").rows == [[3, 1]]


def test_sort_by_puts_none_last():
    t = Table(["n"], [[3], [None], [1], [2]])
    assert t.sort_by("n").column("n") == [1, 2, 3, None]
    assert t.sort_by("n", reverse=True).column("n") == [3, 2, 1, None]


def test_len_and_iter():
    t = Table(["a"], [[1], [2]])
    assert len(t) == 2
    assert [row[0] for row in t] == [1, 2]
