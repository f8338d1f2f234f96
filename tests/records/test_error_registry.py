"""The error registry: one class per wire code, each findable by :func:`for_code`."""

from __future__ import annotations

import inspect

import pytest

from tidewire import errors
from tidewire.errors import RecordBatchError, TidewireError, UnknownError, for_code

EXPORTED = [getattr(errors, name) for name in errors.__all__]
ERROR_CLASSES = [
    obj
    for obj in EXPORTED
    if inspect.isclass(obj) and issubclass(obj, TidewireError) and obj is not TidewireError
]


def test_all_names_exist_and_are_sorted() -> None:
    assert errors.__all__ == sorted(errors.__all__)
    assert len(set(errors.__all__)) == len(errors.__all__)
    assert len(ERROR_CLASSES) >= 20


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_each_class_is_registered_under_its_own_code(cls: type[TidewireError]) -> None:
    assert "code" in cls.__dict__, f"{cls.__name__} inherits its code"
    assert isinstance(cls.code, int)
    assert 0 < cls.code < 2**15  # a positive int16 on the wire
    assert for_code(cls.code) is cls
    assert isinstance(cls.description, str)
    assert cls.description.strip()
    assert "description" in cls.__dict__, f"{cls.__name__} inherits its description"
    assert isinstance(cls.retriable, bool)
    assert cls().message == cls.description
    assert cls("a message naming 42 bytes").message == "a message naming 42 bytes"


def test_codes_are_unique() -> None:
    codes = [cls.code for cls in ERROR_CLASSES]
    assert len(codes) == len(set(codes))


def test_the_registry_holds_only_exported_classes() -> None:
    registered = {for_code(code) for code in range(-1, 2**15)}
    assert registered == set(ERROR_CLASSES)


def test_unknown_codes_map_to_unknown_error() -> None:
    for code in (-1, 0, 2, 9, 999, 2**15):
        assert for_code(code) is UnknownError


def test_record_batch_errors_are_never_retriable() -> None:
    batch_errors = [cls for cls in ERROR_CLASSES if issubclass(cls, RecordBatchError)]
    assert len(batch_errors) == 9
    assert not any(cls.retriable for cls in batch_errors)


def test_a_duplicate_code_is_refused_at_class_creation() -> None:
    with pytest.raises(RuntimeError, match="registered twice"):
        type("Duplicate", (TidewireError,), {"code": errors.CorruptBatchError.code})
    assert for_code(errors.CorruptBatchError.code) is errors.CorruptBatchError
