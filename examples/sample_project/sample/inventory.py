"""Items with prices and stock, and the totals a shop needs."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Item:
    name: str
    price_cents: int
    stock: int


def total_value(items: list[Item]) -> int:
    return sum(item.price_cents * item.stock for item in items)


def restock(item: Item, amount: int) -> Item:
    if amount <= 0:
        raise ValueError("amount must be positive")
    return Item(item.name, item.price_cents, item.stock + amount)


def format_price(cents: int) -> str:
    return f"${cents // 100}.{cents % 100:02d}"
