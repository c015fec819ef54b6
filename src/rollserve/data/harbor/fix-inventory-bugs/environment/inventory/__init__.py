"""A small stock-keeping library."""

from inventory.core import Inventory, Item

__all__ = ["Inventory", "Item"]
