"""d0's engine: plain data in, plain data out. Imports nothing from Django, so it runs on a bare GPU node."""
