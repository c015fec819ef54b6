import rollserve.testing


def test_every_exported_name_is_importable_from_the_package() -> None:
    # __all__ is written out (for linters and type checkers); each name is imported lazily.
    assert set(rollserve.testing.__all__) == set(rollserve.testing._HOMES)
    for name in rollserve.testing.__all__:
        assert getattr(rollserve.testing, name).__name__ == name
