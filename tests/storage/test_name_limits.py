"""The topic name limit (MAX_TOPIC_NAME) against the file-name limit of a real file system:
the longest name with the highest partition is created, written, reopened and deleted, and
every directory name it needs (``NAME-PARTITION``, ``NAME-PARTITION.<32 hex>-delete``) fits
in 255 bytes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tidewire.errors import InvalidConfigError
from tidewire.records import build_batch
from tidewire.storage import LogManager
from tidewire.storage.manager import MAX_PARTITION, MAX_TOPIC_NAME, validate_topic_name

#: NAME_MAX of Linux's common file systems (ext4, xfs, btrfs, tmpfs).
NAME_MAX = 255


def test_the_limit_leaves_room_for_every_directory_name() -> None:
    longest_partition = len(str(MAX_PARTITION - 1))
    deleted_suffix = len(f"-{MAX_PARTITION - 1}.{'0' * 32}-delete")
    assert MAX_TOPIC_NAME + 1 + longest_partition <= NAME_MAX
    assert MAX_TOPIC_NAME + deleted_suffix <= NAME_MAX


def test_boundary() -> None:
    validate_topic_name("x" * MAX_TOPIC_NAME)
    with pytest.raises(InvalidConfigError) as err:
        validate_topic_name("x" * (MAX_TOPIC_NAME + 1))
    assert err.value.message == (
        f"topic name of {MAX_TOPIC_NAME + 1} characters exceeds the limit of {MAX_TOPIC_NAME}"
    )


def test_longest_name_and_highest_partition_on_a_real_file_system(tmp_path: Path) -> None:
    data = tmp_path / "data"
    name = "n" * MAX_TOPIC_NAME
    partition = MAX_PARTITION - 1
    if os.pathconf(tmp_path, "PC_NAME_MAX") < NAME_MAX:
        pytest.skip("this file system has shorter file names than Linux's usual 255 bytes")
    mgr = LogManager(str(data)).open()
    try:
        mgr.create_log(name, partition).append(build_batch([b"hello"], timestamp_ms=0))
    finally:
        mgr.close()
    assert (data / f"{name}-{partition}").is_dir()
    mgr = LogManager(str(data)).open()
    try:
        assert mgr.get_log(name, partition).log_end_offset == 1
        assert mgr.delete_topic(name) == [partition]
    finally:
        mgr.close()
    assert not [p for p in data.iterdir() if p.name.startswith("n")]
