"""Configuration of ``tidewire serve``: file < environment < flags, every kind of bad value
named with where it came from, and ``tidewire config init`` loading back to the defaults."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from tests.cli._support import run_cli, serving
from tidewire.broker import BrokerConfig
from tidewire.client import Client
from tidewire.config import (
    DEFAULT_DATA_DIR,
    SETTINGS,
    default_toml,
    load_settings,
    unknown_env_vars,
)
from tidewire.errors import InvalidConfigError
from tidewire.server import ServerConfig
from tidewire.storage import FsyncPolicy, LogConfig


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_are_the_config_classes_defaults() -> None:
    s = load_settings(env={})
    assert s.broker == BrokerConfig(DEFAULT_DATA_DIR)
    assert s.broker.log == LogConfig()
    assert s.server == ServerConfig()
    assert set(s.origins.values()) == {"default"}


def test_every_setting_has_a_distinct_env_var_and_flag_on_serve() -> None:
    assert len({s.env for s in SETTINGS}) == len(SETTINGS)
    assert len({s.flag for s in SETTINGS}) == len(SETTINGS)
    result = run_cli(["serve", "--help"], env={"COLUMNS": "200"})
    for s in SETTINGS:
        assert s.flag in result.stdout, s.flag
        assert s.env == "TIDEWIRE_" + s.key.upper()


def test_file_sets_every_section(tmp_path: Path) -> None:
    path = write(
        tmp_path / "t.toml",
        """
        [broker]
        data_dir = "/var/lib/tw"
        default_partitions = 4
        auto_create_topics = false
        [log]
        fsync = "always"
        retention_ms = -1
        segment_bytes = 1_048_576
        [server]
        host = "0.0.0.0"
        port = 9000
        idle_timeout_s = 5
        """,
    )
    s = load_settings(path, env={})
    assert s.broker.data_dir == "/var/lib/tw"
    assert s.broker.default_partitions == 4
    assert s.broker.auto_create_topics is False
    assert s.broker.log.fsync is FsyncPolicy.ALWAYS
    assert s.broker.log.retention_ms == -1
    assert s.broker.log.segment_bytes == 1_048_576
    assert (s.server.host, s.server.port) == ("0.0.0.0", 9000)
    assert s.server.idle_timeout_s == 5.0
    assert isinstance(s.server.idle_timeout_s, float)
    assert s.origins["port"] == f"{path} [server] port"
    assert s.origins["max_in_flight"] == "default"


def test_precedence_file_then_env_then_flag(tmp_path: Path) -> None:
    path = write(tmp_path / "t.toml", "[server]\nport = 9001\n[log]\nfsync = 'never'\n")
    env = {"TIDEWIRE_PORT": "9002", "TIDEWIRE_FSYNC": "always", "TIDEWIRE_HOST": "::1"}
    s = load_settings(path, env=env, flags={"port": 9003, "host": None})
    assert s.server.port == 9003  # flag > env > file
    assert s.origins["port"] == "flag --port"
    assert s.broker.log.fsync is FsyncPolicy.ALWAYS  # env > file
    assert s.origins["fsync"] == "environment variable TIDEWIRE_FSYNC"
    assert s.server.host == "::1"  # a flag given as None is "not given"
    s = load_settings(path, env={})
    assert s.server.port == 9001


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("true", True), ("1", True), ("YES", True), ("on", True), ("false", False), ("0", False)],
)
def test_env_booleans(raw: str, expected: bool) -> None:
    s = load_settings(env={"TIDEWIRE_AUTO_CREATE_TOPICS": raw})
    assert s.broker.auto_create_topics is expected


def test_env_numbers_and_paths() -> None:
    s = load_settings(
        env={
            "TIDEWIRE_DATA_DIR": "/srv/data",
            "TIDEWIRE_MAX_WAIT_MS": " 250 ",
            "TIDEWIRE_FRAME_TIMEOUT_S": "2.5",
            "TIDEWIRE_FSYNC": "Interval",
        }
    )
    assert s.broker.data_dir == "/srv/data"
    assert s.broker.max_wait_ms == 250
    assert s.server.frame_timeout_s == 2.5
    assert s.broker.log.fsync is FsyncPolicy.INTERVAL


def test_unknown_env_vars_are_reported() -> None:
    env = {"TIDEWIRE_PROT": "1", "TIDEWIRE_PORT": "1", "TIDEWIRE_ADDR": "x", "HOME": "/"}
    assert unknown_env_vars(env) == ["TIDEWIRE_PROT"]


# --- errors: each names its source and what is allowed ----------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[server]\nprot = 1\n", "unknown key 'prot' in [server] (did you mean 'port'?)"),
        ("[server]\nfsync = 'always'\n", "unknown key 'fsync' in [server]; it belongs under [log]"),
        ("[brokr]\n", "unknown section [brokr] (did you mean 'broker'?)"),
        ("port = 1\n", "key 'port' is outside any section; put it under [server]"),
        ("colour = 1\n", "key 'colour' is outside any section; the sections are [broker]"),
        ("[server]\nport = '80'\n", "[server] port: must be an integer, got the string '80'"),
        ("[server]\nport = 80.5\n", "[server] port: must be an integer, got the number 80.5"),
        ("[broker]\nauto_create_topics = 1\n", "must be true or false, got the number 1"),
        ("[broker]\ndata_dir = 5\n", "[broker] data_dir: must be a string, got the number 5"),
        ("[broker]\ndata_dir = ''\n", "[broker] data_dir: data_dir must not be empty"),
        ("[log]\nfsync = 'sometimes'\n", "must be one of always, interval, never, got 'sometimes'"),
        ("[log]\nfsync = true\n", "[log] fsync: must be one of 'always', 'interval', 'never'"),
        ("[log]\nsegment_bytes = [1]\n", "[log] segment_bytes: must be an integer, got an array"),
        ("[server]\nport = 70000\n", "[server] port: port=70000 must be within 0..65535"),
        ("[broker]\ndefault_partitions = 0\n", "default_partitions=0 must be within 1.."),
        ("[log]\nsegment_bytes = 10\n", "[log] segment_bytes: segment_bytes=10 must be within"),
        ("[log]\nretention_ms = -5\n", "retention_ms=-5 must be -1 (keep forever) or >= 0"),
        ("[server]\nidle_timeout_s = 0\n", "idle_timeout_s=0.0 must be a number of seconds > 0"),
        ("[server]\nidle_timeout_s = inf\n", "idle_timeout_s=inf must be a finite number"),
        ("[server]\nmax_frame_bytes = 10\n", "max_frame_bytes=10 must be within 1,024.."),
        ("[server]\nhost = ''\n", "host must not be empty"),
        ("[server\nport = 1\n", "not valid TOML: "),
        ("[server]\nport = 1\nport = 2\n", "not valid TOML: "),
    ],
)
def test_bad_file(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path / "bad.toml", text)
    with pytest.raises(InvalidConfigError) as info:
        load_settings(path, env={})
    assert info.value.message.startswith(f"{path}")
    assert message in info.value.message


def test_file_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b"[server]\nhost = '\xe9'\n")
    with pytest.raises(InvalidConfigError, match="not valid TOML: the file is not UTF-8"):
        load_settings(path, env={})


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(InvalidConfigError) as info:
        load_settings(path, env={})
    assert info.value.message == f"{path}: cannot read the config file: No such file or directory"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TIDEWIRE_PORT": "eighty"}, "environment variable TIDEWIRE_PORT: must be an integer"),
        ({"TIDEWIRE_PORT": "-1"}, "environment variable TIDEWIRE_PORT: port=-1 must be within"),
        ({"TIDEWIRE_FSYNC": "maybe"}, "TIDEWIRE_FSYNC: must be one of always, interval, never"),
        ({"TIDEWIRE_AUTO_CREATE_TOPICS": "sure"}, "TIDEWIRE_AUTO_CREATE_TOPICS: must be true"),
        ({"TIDEWIRE_IDLE_TIMEOUT_S": "soon"}, "TIDEWIRE_IDLE_TIMEOUT_S: must be a number"),
        ({"TIDEWIRE_IDLE_TIMEOUT_S": "nan"}, "TIDEWIRE_IDLE_TIMEOUT_S: idle_timeout_s=nan"),
        ({"TIDEWIRE_MAX_WAIT_MS": "4000000"}, "max_wait_ms=4000000 must be within 0..3,600,000"),
        ({"TIDEWIRE_DATA_DIR": " "}, "TIDEWIRE_DATA_DIR: data_dir must not be empty"),
    ],
)
def test_bad_env(env: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        load_settings(env=env)
    assert message in info.value.message


def test_bad_flag() -> None:
    with pytest.raises(InvalidConfigError) as info:
        load_settings(env={}, flags={"max_in_flight": 0})
    assert info.value.message == "flag --max-in-flight: max_in_flight=0 must be >= 1"


def test_serve_reports_the_bad_source_and_exits_2(tmp_path: Path) -> None:
    path = write(tmp_path / "t.toml", "[log]\nflush_interval_ms = 0\n")
    result = run_cli(["serve", "--config", str(path)])
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: {path} [log] flush_interval_ms: flush_interval_ms=0 must be within 1..3,600,000\n"
    )
    result = run_cli(["serve"], env={"TIDEWIRE_PORT": "99999"})
    assert result.exit_code == 2
    assert "error: environment variable TIDEWIRE_PORT: port=99999" in result.stderr
    result = run_cli(["serve", "--config", str(tmp_path / "missing.toml")])
    assert result.exit_code == 2
    assert "cannot read the config file" in result.stderr


# --- config init and show ---------------------------------------------------------------------


def test_config_init_loads_back_to_exactly_the_defaults(tmp_path: Path) -> None:
    result = run_cli(["config", "init"])
    assert result.exit_code == 0
    assert result.stdout == default_toml()
    doc = tomllib.loads(result.stdout)
    # Every key is there, each with a comment line above it.
    assert {k for table in doc.values() for k in table} == {s.key for s in SETTINGS}
    lines = result.stdout.splitlines()
    for s in SETTINGS:
        i = next(i for i, line in enumerate(lines) if line.startswith(f"{s.key} = "))
        assert lines[i - 1].startswith("# ")
        assert s.env in lines[i - 1]
    path = write(tmp_path / "tidewire.toml", result.stdout)
    from_file = load_settings(path, env={})
    defaults = load_settings(env={})
    assert (from_file.broker, from_file.server) == (defaults.broker, defaults.server)
    for s in SETTINGS:
        assert from_file.value(s.key) == s.default
        assert type(from_file.value(s.key)) is type(s.default)


def test_config_init_output_file(tmp_path: Path) -> None:
    path = tmp_path / "tw.toml"
    assert run_cli(["config", "init", "-o", str(path)]).exit_code == 0
    assert path.read_text(encoding="utf-8") == default_toml()
    again = run_cli(["config", "init", "-o", str(path)])
    assert again.exit_code == 1
    assert "cannot write" in again.stderr
    assert "File exists" in again.stderr


def test_config_show_names_the_origins(tmp_path: Path) -> None:
    path = write(tmp_path / "t.toml", "[server]\nport = 9100\nhost = '0.0.0.0'\n")
    result = run_cli(
        ["config", "show", "--config", str(path), "--json"], env={"TIDEWIRE_PORT": "9200"}
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["settings"]["server"]["port"] == 9200
    assert doc["settings"]["server"]["host"] == "0.0.0.0"
    assert doc["settings"]["log"]["fsync"] == "interval"
    assert doc["origins"]["port"] == "environment variable TIDEWIRE_PORT"
    assert doc["origins"]["host"] == f"{path} [server] host"
    text = run_cli(["config", "show", "--config", str(path)]).stdout
    assert "port = 9100  # " + f"{path} [server] port" in text
    assert "[log]" in text


# --- a real broker: file < env < flag --------------------------------------------------------


def test_serve_applies_file_then_env_then_flags(tmp_path: Path) -> None:
    path = write(
        tmp_path / "t.toml",
        f"""
        [broker]
        data_dir = "{tmp_path / "from-file"}"
        default_partitions = 2
        [log]
        fsync = "never"
        retention_ms = 1000
        segment_ms = 60000
        [server]
        port = 1
        """,
    )
    env = {
        "TIDEWIRE_DEFAULT_PARTITIONS": "3",
        "TIDEWIRE_FSYNC": "always",
        "TIDEWIRE_RETENTION_MS": "2000",
        "TIDEWIRE_CONFIG": str(path),
    }
    # --port 0 (a flag) wins over the file's port 1; --data-dir is left to the file.
    flags = ("--partitions", "4", "--retention-ms", "3000")
    with serving(None, *flags, env=env) as (_, port), Client(f"127.0.0.1:{port}") as client:
        client.create_topic("t")
        desc = client.describe_topic("t")
    assert len(desc.partitions) == 4  # flag > env > file
    assert desc.config.fsync == "always"  # env > file
    assert desc.config.retention_ms == 3000  # flag > env
    assert desc.config.segment_ms == 60000  # file > default
    assert (tmp_path / "from-file" / "t-0").is_dir()
