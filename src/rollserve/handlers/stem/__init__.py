"""The STEM family: multiple choice, numbers with units, short answers."""
