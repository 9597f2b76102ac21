"""Console views, one module per page family. Each validates input and calls a service or a
selector; none writes to the database itself."""
