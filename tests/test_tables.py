"""mgpu.runtime.tables: a notebook's table as a value, aligned as text and drawn as HTML."""

import pytest

from mgpu.runtime.tables import Table


def test_columns_keep_first_seen_order_formats_apply_and_missing_values_are_dashes():
    table = Table([{"version": "1: +init", "val acc": 0.12345, "images": 1024},
                   {"version": "converted", "images": 4096, "spread": 1e-9}],
                  formats={"val acc": ".3f"})
    assert table.columns == ["version", "val acc", "images", "spread"]
    text = str(table).splitlines()
    assert text[0].split() == ["version", "val", "acc", "images", "spread"]
    assert "0.123" in text[2] and "0.12345" not in text[2]
    assert text[3].split() == ["converted", "-", "4096", "1e-09"]
    # Every line is as wide as the header: the columns line up.
    assert len({len(line) for line in text}) == 1
    noted = Table([{"stage": "a", "rate": 12.5}, {"stage": "b", "rate": "(needs a GPU)"}], formats={"rate": ",.0f"})
    assert str(noted).splitlines()[-1].split()[-3:] == ["(needs", "a", "GPU)"]
    assert table.column("images") == [1024, 4096] and table.column("spread") == [None, 1e-9]
    with pytest.raises(KeyError, match="no column 'x'"):
        table.column("x")


def test_html_escapes_and_a_format_for_an_unknown_column_is_refused():
    html = Table([{"<b>": "a & b"}], title="t<1>")._repr_html_()
    assert "&lt;b&gt;" in html and "a &amp; b" in html and "<caption>t&lt;1&gt;</caption>" in html
    with pytest.raises(ValueError, match="does not have"):
        Table([{"a": 1}], formats={"b": ".2f"})
