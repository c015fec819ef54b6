import unittest

from inventory import Inventory


class InventoryTest(unittest.TestCase):
    def test_first_page(self):
        stock = Inventory()
        for name in ("bolt", "nut", "washer"):
            stock.add(name, 1, 10)
        self.assertEqual(stock.page(1, 2), ["bolt", "nut"])

    def test_total_value_has_two_decimals(self):
        stock = Inventory()
        stock.add("bolt", 3, 410)
        self.assertEqual(stock.total_value(), "12.30")

    def test_tags(self):
        stock = Inventory()
        stock.add("bolt", 1, 10)
        stock.add("nut", 1, 10)
        stock.tag("bolt", "metal")
        self.assertEqual(stock.with_tag("metal"), ["bolt"])


if __name__ == "__main__":
    unittest.main()
