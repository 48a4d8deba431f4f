"""Pure parts of the client: query-string encoding and node settings (no network)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from urllib.parse import parse_qsl

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.client import NodeClient
from connectors.params import encode_query, encoded_query_length, list_param, on_base
from connectors.settings import NodeSettings, SecretText, SettingsError

UNRESERVED = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def test_encode_query_exact() -> None:
    moment = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    query = encode_query(
        {
            "cmd": "historyMany",
            "paths": ["/Plant B/Pumps, Main/Flow, Rate", '/q "x"'],
            "start": moment,
            "options.invalidAsNull": False,
            "options.limit": 500,
            "options.method": None,
        }
    )
    assert query == (
        "cmd=historyMany"
        "&paths=%5B%22%2FPlant%20B%2FPumps%2C%20Main%2FFlow%2C%20Rate%22%2C%22%2Fq%20%5C%22x%5C%22%22%5D"
        "&start=2024-05-06T07%3A08%3A09.123Z"
        "&options.invalidAsNull=false"
        "&options.limit=500"
    )


def test_times_are_sent_in_utc_with_z_whatever_the_offset() -> None:
    cest = timezone(timedelta(hours=2))
    query = encode_query({"start": datetime(2024, 5, 6, 9, 0, tzinfo=cest)})
    assert query == "start=2024-05-06T07%3A00%3A00.000Z"


def test_a_naive_datetime_is_refused_not_guessed() -> None:
    with pytest.raises(ValueError, match="naive"):
        encode_query({"start": datetime(2024, 5, 6)})  # noqa: DTZ001


def test_lists_keep_their_json_types_and_sets_are_ordered() -> None:
    assert list_param(["/a", "/b,c"]) == '["/a","/b,c"]'
    query = dict(parse_qsl(encode_query({"v": [1, 2.5, True, None, "x"], "s": {"b", "a"}})))
    assert orjson.loads(query["v"]) == [1, 2.5, True, None, "x"]
    assert query["s"] == '["a","b"]'


def test_mappings_are_json_objects() -> None:
    query = dict(parse_qsl(encode_query({"data": {"k": [1, "é"]}})))
    assert orjson.loads(query["data"]) == {"k": [1, "é"]}


def test_encoded_query_length_is_the_length_of_the_encoding() -> None:
    params = {"paths": ["/温度/" + "x" * 50] * 10, "cmd": "historyMany"}
    assert encoded_query_length(params) == len(encode_query(params))
    assert encoded_query_length(params) > len(str(params))  # percent-encoding costs


# Any Unicode except lone surrogates, which no JSON answer can hold either.
_text = st.text(st.characters(codec="utf-8"), max_size=40)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_text.filter(bool), _text, max_size=6))
def test_any_key_and_value_round_trip_through_the_query(params: dict[str, str]) -> None:
    query = encode_query(params)
    assert set(query) - UNRESERVED <= {"%", "=", "&"}
    assert dict(parse_qsl(query, keep_blank_values=True)) == params


@settings(max_examples=200, deadline=None)
@given(st.lists(_text, max_size=8))
def test_any_list_of_paths_round_trips_as_a_json_array(paths: list[str]) -> None:
    (pair,) = parse_qsl(encode_query({"paths": paths}), keep_blank_values=True)
    assert orjson.loads(pair[1]) == paths


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["http://node:3003/", "https://[::1]:8443/n3/", "http://user@h/a%20b/"]),
    st.sampled_from(["tag", "system", "tag/", "../x"]),
    st.dictionaries(_text.filter(bool), _text, max_size=4),
    st.sampled_from(["", "&x=%", "&y=a b", "&z=%zz"]),
)
def test_a_url_on_the_base_is_the_url_httpx_parses_from_its_text(
    base: str, resource: str, params: dict[str, str], tail: str
) -> None:
    # Built without parsing where the query is what encode_query writes; parsed otherwise
    # (a resource that is not a name, a query with characters httpx would quote): the
    # same URL either way, to the byte httpx sends.
    query = encode_query({"cmd": "historyMany", **params}) + tail
    built = on_base(httpx.URL(base), resource, query)
    parsed = httpx.URL(f"{base.removesuffix('/')}/{resource}?{query}")
    assert built == parsed
    assert (built.raw_path, built.raw_host, built.port) == (
        parsed.raw_path,
        parsed.raw_host,
        parsed.port,
    )


# -- settings --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("http://node", "http://node:3003"),
        ("https://node", "https://node:3443"),
        ("https://node:8443/", "https://node:8443"),
        ("http://10.0.0.5:3003/api/", "http://10.0.0.5:3003/api"),
        ("http://[::1]", "http://[::1]:3003"),
    ],
)
def test_base_url_takes_the_documented_default_ports(url: str, base: str) -> None:
    assert NodeSettings(url=url).base_url == base


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"url": "ftp://node"}, "not an http"),
        ({"url": "node:3003"}, "not an http"),
        ({"url": "https://user:pw@node"}, "environment variables"),
        ({"url": "http://n", "max_connections": 0}, "max_connections"),
        ({"url": "http://n", "retries": -1}, "retries"),
        ({"url": "http://n", "read_timeout_s": 0}, "timeouts"),
        ({"url": "http://n", "username_env": "U"}, "go together"),
        (
            {"url": "http://n", "token_env": "T", "username_env": "U", "password_env": "P"},
            "not both",
        ),
        ({"url": "http://n", "token_env": "T", "token": SecretText("pw")}, "not both"),
        (
            {
                "url": "http://n",
                "username_env": "U",
                "password_env": "P",
                "password": SecretText("pw"),
            },
            "not both",
        ),
    ],
)
def test_settings_that_cannot_work_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError, match=message) as caught:
        NodeSettings(**kwargs)  # type: ignore[arg-type]
    assert "pw" not in str(caught.value)


def test_a_missing_variable_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HISTORIAN_TEST_ABSENT_TOKEN", raising=False)
    settings = NodeSettings(url="http://n", name="plant", token_env="HISTORIAN_TEST_ABSENT_TOKEN")
    with pytest.raises(SettingsError, match="HISTORIAN_TEST_ABSENT_TOKEN") as caught:
        NodeClient(settings)
    assert "plant" in str(caught.value)


def test_settings_hold_names_not_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_T", "tok-SETTINGS-1")
    settings = NodeSettings(url="http://n", token_env="NODE_T")
    assert settings.bearer_token() == "tok-SETTINGS-1"
    assert "tok-SETTINGS-1" not in repr(settings)
    assert hash(settings) == hash(NodeSettings(url="http://n", token_env="NODE_T"))


def test_an_unreadable_ca_bundle_is_a_clear_error() -> None:
    settings = NodeSettings(url="https://n", ca_bundle="/nonexistent/ca.pem")
    with pytest.raises(SettingsError, match=r"ca_bundle /nonexistent/ca\.pem"):
        NodeClient(settings)


def test_a_given_secret_is_used_and_shown_nowhere() -> None:
    import pickle

    settings = NodeSettings(url="http://n", token=SecretText("tok-VALUE-2"))
    assert settings.bearer_token() == "tok-VALUE-2"
    assert "tok-VALUE-2" not in repr(settings)
    assert "tok-VALUE-2" not in str(settings.token)
    copied = pickle.loads(pickle.dumps(settings))  # a Dask worker gets the job pickled
    assert copied == settings
    assert copied.bearer_token() == "tok-VALUE-2"


def test_a_user_with_a_given_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_U", "operator")
    settings = NodeSettings(url="http://n", username_env="NODE_U", password=SecretText("pw-3"))
    assert settings.basic_credentials() == ("operator", "pw-3")
    assert "pw-3" not in repr(settings)


def test_the_connectors_do_not_import_prefect() -> None:
    import subprocess
    import sys

    code = (
        "import sys, connectors.client, connectors.fetch, connectors.settings, "
        "connectors.version; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'prefect'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
