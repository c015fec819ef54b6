"""The math family: answers in \boxed{}, with or without the python tool."""
