import sys

import pytest

from sample.inventory import Item, format_price, restock, total_value


def test_total_value_sums_price_times_stock():
    assert total_value([Item("pen", 150, 4), Item("ink", 900, 1)]) == 1500


def test_total_value_of_nothing_is_zero():
    assert total_value([]) == 0


def test_restock_adds_to_stock():
    assert restock(Item("pen", 150, 4), 6).stock == 10


def test_restock_refuses_non_positive_amounts():
    with pytest.raises(ValueError, match="positive"):
        restock(Item("pen", 150, 4), 0)


@pytest.mark.parametrize(("cents", "text"), [(0, "$0.00"), (5, "$0.05"), (1999, "$19.99")])
def test_format_price(cents, text):
    assert format_price(cents) == text


@pytest.mark.skipif(sys.platform != "win32", reason="Windows-only behaviour")
def test_windows_line_endings():
    assert format_price(100) == "$1.00"


@pytest.mark.slow
def test_large_inventory():
    items = [Item(f"item{i}", i, 1) for i in range(10_000)]
    assert total_value(items) == sum(range(10_000))
