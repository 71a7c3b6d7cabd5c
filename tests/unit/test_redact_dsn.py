import pytest

from feiqiu_etl.db.connection import redact_dsn


@pytest.mark.parametrize("dsn", [
    "postgresql://etl:s3cretPW@db.example:5432/warehouse",
    "postgresql://postgres:p@ss@s3cretPW-xyz@/nope_db?host=/tmp/x",
    "postgresql://etl@db/warehouse?password=s3cretPW&sslmode=require",
    "host=db user=etl password='my s3cretPW-xyz' dbname=w",
    "host=db user=etl password=s3cretPW dbname=w",
    "host=db password='unterminated s3cretPW",
])
def test_passwords_never_survive(dsn):
    out = redact_dsn(dsn)
    assert "s3cretPW" not in out and "p@ss" not in out


def test_the_rest_stays_readable():
    assert redact_dsn("postgresql://etl:pw@db:5432/w?sslmode=require") == "postgresql://etl:***@db:5432/w?sslmode=require"
    assert redact_dsn("postgresql://etl@db/w") == "postgresql://etl@db/w"
    assert "host=db" in redact_dsn("host=db user=etl password=pw dbname=w")


def test_scrub_removes_password_pieces_from_driver_messages():
    from feiqiu_etl.db.connection import scrub

    dsn = "postgresql://postgres:p@ssS3cretPW-xyz@/nope_db?host=/tmp/x"
    msg = 'could not translate host name "ssS3cretPW-xyz@" to address'
    assert "S3cretPW" not in scrub(msg, dsn)
    assert scrub("password authentication failed for user etl", "host=db password=pw1234") == \
        "password authentication failed for user etl"


@pytest.mark.parametrize("dsn", [
    "postgresql://postgres:TopSecret?Pw@localhost/nope",
    "postgresql://postgres:TopSecret/Pw@/nope?host=/tmp/x",
    "postgresql://postgres:Top:Secret#Pw@localhost:5432/db",
])
def test_unencoded_special_characters_in_uri_passwords(dsn):
    from feiqiu_etl.db.connection import scrub

    assert "Secret" not in redact_dsn(dsn)
    assert "Secret" not in scrub('invalid integer value "TopSecret" for connection option "port"', dsn)


def test_an_empty_password_is_not_shown_as_a_masked_one():
    from feiqiu_etl.db.connection import redact_dsn

    shown = redact_dsn("user=postgres password='' passfile=/home/x/pgpass host=/tmp/run")
    assert "password" not in shown and "passfile=/home/x/pgpass" in shown
