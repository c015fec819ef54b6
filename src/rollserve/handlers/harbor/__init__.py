"""The ``harbor`` task family: Harbor-format task folders (see ``handler``)."""
