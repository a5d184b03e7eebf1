"""The option table, one module per help panel (in the order the help lists them)."""
