"""Items in stock: quantities, prices in cents, tags."""

from dataclasses import dataclass


@dataclass
class Item:
    name: str
    qty: int
    price_cents: int
    tags: list


class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, qty, price_cents, tags=[]):
        """Add ``qty`` of a new item, or more of one already there (its price and
        tags are then kept). ``qty`` must be positive, else ValueError."""
        if qty <= 0:
            raise ValueError("qty must be positive")
        if name in self.items:
            self.items[name].qty += qty
        else:
            self.items[name] = Item(name, qty, price_cents, tags)

    def tag(self, name, tag):
        """Give item ``name`` the tag ``tag`` (once: tagging twice changes nothing).
        KeyError for an unknown item."""
        tags = self.items[name].tags
        if tag not in tags:
            tags.append(tag)

    def remove(self, name, qty):
        """Take ``qty`` of item ``name`` out of stock. ValueError if ``qty`` is not
        positive or more than there is; KeyError for an unknown item. An item whose
        quantity falls to 0 stays listed."""
        if qty <= 0:
            raise ValueError("qty must be positive")
        self.items[name].qty -= qty

    def with_tag(self, tag):
        """Names of the items that have ``tag``, sorted."""
        return sorted(name for name, item in self.items.items() if tag in item.tags)

    def total_value(self):
        """The value of the whole stock, in units (not cents), as a string with two
        decimals: "12.30"."""
        cents = sum(item.qty * item.price_cents for item in self.items.values())
        return str(cents / 100)

    def page(self, number, per_page):
        """Page ``number`` (the first page is 1) of the item names, sorted, ``per_page``
        names a page; an empty list past the last page."""
        names = sorted(self.items)
        return names[number * per_page:(number + 1) * per_page]
