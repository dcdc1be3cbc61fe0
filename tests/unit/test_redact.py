"""Every form a secret takes in a connection string or a settings mapping is hidden, and what is not
secret stays readable, so that messages still say which setting is wrong."""

from __future__ import annotations

import pytest

from onceflow import redact

PW = "s3cr3t-PW-1234"


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        (f"postgresql+psycopg://onceflow:{PW}@db:5432/x", "postgresql+psycopg://onceflow:***@db:5432/x"),
        (f"ONCEFLOW_PG_DSN='postgresql://u:{PW}@h/x': bad", "ONCEFLOW_PG_DSN='postgresql://u:***@h/x': bad"),
        (f"postgresql://u:p@ss{PW}@h/x", "postgresql://u:***@h/x"),
        (f"onceflow:{PW}@h/ledger", "onceflow:***@h/ledger"),
        (f"host=h user=u password={PW} dbname=x", "host=h user=u password=*** dbname=x"),
        (f"host=h password='{PW} two' dbname=x", "host=h password='***' dbname=x"),
        (f"postgresql://u@h/x?sslpassword={PW}&a=1", "postgresql://u@h/x?sslpassword=***&a=1"),
        (f"sc://h:15002/;token={PW}==;user_id=me", "sc://h:15002/;token=***;user_id=me"),
        (
            f"{{'s3.secret-access-key': '{PW}', 'type': 'sql'}}",
            "{'s3.secret-access-key': '***', 'type': 'sql'}",
        ),
    ],
)
def test_secrets_are_hidden_in_every_form(given: str, shown: str) -> None:
    assert redact.text(given) == shown


@pytest.mark.parametrize(
    "plain",
    [
        "sc://127.0.0.1:15002",
        "postgresql://onceflow@127.0.0.1:15432/onceflow",
        "kafka sink config key_column='k': only used with value_format 'json'",
        'password authentication failed for user "onceflow"',
    ],
)
def test_what_is_not_secret_is_left_alone(plain: str) -> None:
    assert redact.text(plain) == plain


def test_a_mapping_keeps_its_shape_and_loses_its_secrets() -> None:
    shown = redact.mapping(
        {"type": "sql", "uri": f"postgresql://u:{PW}@h/c", "credential": PW, "nested": {"token": PW}, "n": 5}
    )
    assert shown == {
        "type": "sql",
        "uri": "postgresql://u:***@h/c",
        "credential": "***",
        "nested": {"token": "***"},
        "n": 5,
    }
