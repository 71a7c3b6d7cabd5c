"""The DWD mapping file (warehouse-model §4.4, §5.2) and its validation; cast SQL keeps values as parameters."""

import textwrap

import pytest
import yaml

from feiqiu_etl.tasks.dwd.casts import cast_sql
from feiqiu_etl.connector.dwd_mapping import DwdColumn, DwdMappingError, WhenSpec, load_dwd_mapping

DIMS = ["dim_member", "dim_member_card", "dim_table", "dim_table_area", "dim_goods", "dim_goods_category",
        "dim_assistant", "dim_group_package"]
FACTS = ["dwd_settlement", "dwd_settlement_item", "dwd_table_use", "dwd_goods_sale", "dwd_assistant_service",
         "dwd_payment", "dwd_refund", "dwd_group_verification"]


def test_bundled_mapping_has_the_16_tables_of_the_model():
    m = load_dwd_mapping()
    assert [t.name for t in m.dimensions] == DIMS
    assert [t.name for t in m.facts] == FACTS
    assert m.table("dwd.dim_table").source == "ods.billiard_table"
    assert m.table("dwd_settlement_item").business_key == ("item_id",)
    for t in m.tables:
        assert t.schema == "dwd" and t.source.startswith("ods.")


def test_tracked_columns_are_listed_in_model_order():
    m = load_dwd_mapping()
    assert m.table("dim_member").tracked == (
        "member_no", "member_name", "nickname", "mobile_masked", "gender", "birthday", "level_id", "level_name",
        "level_discount_rate", "status", "referrer_member_id")
    assert m.table("dim_member").type1 == (
        "register_source", "points", "tags", "register_time", "source_update_time")
    assert m.table("dim_member_card").type1 == ("balance", "gift_balance", "remaining_times", "open_time")
    pkg = m.table("dim_group_package")
    assert pkg.type1 == () and pkg.tracked == tuple(c for c in pkg.column_names if c != "package_id")


def test_columns_carry_cast_type_and_nested_paths():
    m = load_dwd_mapping()
    assert m.table("dim_member").column("level_discount_rate") == DwdColumn(
        "level_discount_rate", "numeric(6,4)", "DEC", ("level", "discountRate"))
    assert m.table("dwd_payment").column("settle_id") == DwdColumn(
        "settle_id", "bigint", "SREF", ("bizId",), WhenSpec("bizType", "SETTLEMENT"))
    assert m.table("dwd_payment").column("recharge_no").when == WhenSpec("bizType", "RECHARGE")
    assert m.table("dwd_refund").column("settle_id").when == WhenSpec("bizType", "SETTLEMENT")
    assert m.table("dwd_table_use").column("price_rule_name").path == ("pricing", "ruleName")
    assert m.table("dim_goods_category").column("parent_category_id").cast == "REF"
    assert m.table("dwd_settlement").column("status").sql_type == "smallint"


def test_cast_sql_binds_field_names_and_values_as_parameters():
    col = DwdColumn("settle_id", "bigint", "SREF", ("bizId",), WhenSpec("bizType", "SETTLEMENT"))
    frag = cast_sql(col)
    text = frag.sql.as_string(None)
    assert "bizId" not in text and "SETTLEMENT" not in text and "bizType" not in text
    assert frag.params == ("bizType", "SETTLEMENT", "bizId")
    assert text == ('CASE WHEN ("payload"->>%s) = %s THEN NULLIF(("payload"->>%s), \'\')::bigint END')
    nested = cast_sql(DwdColumn("level_id", "integer", "INT", ("level", "levelId")))
    assert nested.sql.as_string(None) == 'NULLIF(("payload"->%s->>%s), \'\')::integer'
    assert nested.params == ("level", "levelId")


# ------------------------------------------------------------------------------------------------ errors

GOOD = {
    "dimensions": [{
        "table": "dwd.dim_x", "source": "ods.x", "business_key": ["x_id"],
        "columns": [{"column": "x_id", "type": "bigint", "cast": "ID", "field": "xId"},
                    {"column": "name", "type": "text", "cast": "TXT", "field": "name"},
                    {"column": "seen", "type": "timestamptz", "cast": "TS", "field": "seenTime"}],
        "tracked": ["name"], "type1": ["seen"],
    }],
    "facts": [{"table": "dwd.dwd_y", "source": "ods.y", "business_key": ["y_id"],
               "columns": [{"column": "y_id", "type": "bigint", "cast": "ID", "field": "yId"}]}],
}


def _write(tmp_path, doc) -> str:
    p = tmp_path / "bad.dwd.yaml"
    p.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
    return str(p)


def _broken(change):
    import copy

    doc = copy.deepcopy(GOOD)
    change(doc)
    return doc


def _dim_col(i, **kw):
    return lambda d: d["dimensions"][0]["columns"][i].update(kw)


@pytest.mark.parametrize("change, expected", [
    (_dim_col(1, type="integer"),
     "dimensions[0] (dwd.dim_x).columns[1] (name): cast TXT produces text, not integer (warehouse-model §3)"),
    (_dim_col(1, cast="MONEY"), "dimensions[0] (dwd.dim_x).columns[1] (name).cast: Input should be 'TXT'"),
    (_dim_col(1, column="Name"), "dimensions[0] (dwd.dim_x).columns[1] (Name).column: not a lower-case SQL"),
    (_dim_col(1, column="valid_from"), "columns[1] (valid_from): column name 'valid_from' is reserved"),
    (lambda d: (d["dimensions"][0]["columns"].append({"column": "dim_x_sk", "type": "text", "cast": "TXT",
                                                      "field": "sk"}), d["dimensions"][0]["type1"].append("dim_x_sk")),
     "dimensions[0] (dwd.dim_x): column name 'dim_x_sk' is reserved for the surrogate key"),
    (_dim_col(1, field="a..b"), "columns[1] (name).field: String should match pattern"),
    (_dim_col(1, colour="red"), "columns[1] (name).colour: unknown key"),
    (lambda d: d["dimensions"][0].update(tracked=["name", "seen"], type1=[]),
     "dimensions[0] (dwd.dim_x): timestamptz column(s) seen cannot be tracked (warehouse-model §4.1)"),
    (lambda d: d["dimensions"][0].update(type1=[]), "dimensions[0] (dwd.dim_x): column(s) seen are neither"),
    (lambda d: d["dimensions"][0].update(type1=["seen", "name"]), "column(s) name are both tracked and type-1"),
    (lambda d: d["dimensions"][0].update(tracked=["nope"]), "tracked column 'nope' is not among the columns"),
    (lambda d: d["dimensions"][0].update(business_key=["name2"]), "business key column 'name2' is not among"),
    (lambda d: d["facts"][0].update(table="dwd_y"), "facts[0] (dwd_y).table: must be 'schema.table'"),
    (lambda d: d["facts"][0].update(table="dwd.dim_x"), "mapping: DWD table name 'dim_x' is used twice"),
    (lambda d: d["facts"][0]["columns"].append(dict(d["facts"][0]["columns"][0])),
     "facts[0] (dwd.dwd_y): column 'y_id' is mapped twice"),
])
def test_invalid_mapping_is_one_line_naming_file_table_and_column(tmp_path, change, expected):
    path = _write(tmp_path, _broken(change))
    with pytest.raises(DwdMappingError) as err:
        load_dwd_mapping(path)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{path}: ")
    assert expected in msg


def test_the_good_example_loads(tmp_path):
    m = load_dwd_mapping(_write(tmp_path, GOOD))
    assert m.names == ("dim_x", "dwd_y") and m.table("dim_x").tracked == ("name",)


@pytest.mark.parametrize("text, expected", [
    ("dimensions: [", "invalid YAML"),
    ("- just a list", "a DWD mapping must be a YAML mapping"),
    ("dimensions: []\nfacts: []", "the mapping has no dimensions and no facts"),
    (textwrap.dedent("""\
        facts:
          - {table: dwd.f, source: ods.f, business_key: [k],
             columns: [{column: k, type: numeric(12,2), cast: MNY, field: k}]}
        """), "facts[0] (dwd.f).columns[0] (k).type: Input should be"),  # unquoted: YAML splits on the comma
])
def test_unreadable_or_malformed_files(tmp_path, text, expected):
    with pytest.raises(DwdMappingError, match=None) as err:
        load_dwd_mapping(_write(tmp_path, text))
    assert expected in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(DwdMappingError, match="cannot read DWD mapping"):
        load_dwd_mapping(tmp_path / "missing.yaml")


def test_mapping_sources_are_tables_of_the_connector():
    from feiqiu_etl.connector import load_connector

    connector = load_connector()
    ods_tables = {t for spec in connector.tasks for t in spec.tables()}
    assert {t.source for t in load_dwd_mapping().tables} <= ods_tables
    assert connector.dwd_mapping_path() == load_dwd_mapping().source_file
